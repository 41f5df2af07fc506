"""The TensorRT-LLM engine, end to end on the fake TensorRT-LLM of tests/fake_trtllm (no GPU here)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for, message_answer, streamed_answer

FAKE = Path(__file__).resolve().parent / "fake_trtllm"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}]}


@pytest.fixture(scope="module", autouse=True)
def fake_tensorrt_llm() -> Iterator[None]:
    sys.path.insert(0, str(FAKE))
    yield
    sys.path.remove(str(FAKE))
    for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def model_folder(tmp_path: Path, completions: list[str], **files: str) -> Path:
    folder = tmp_path / "gpt-oss-fake"
    folder.mkdir()
    (folder / "script.jsonl").write_text("".join(json.dumps({"completion": c}) + "\n" for c in completions))
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trtllm_server(serve: Callable[..., LiveServer], vocab: Any, folder: Path, **llm: Any) -> LiveServer:
    from proxy.engines.trtllm import TrtllmEngine

    server = serve(engine=TrtllmEngine({"model": str(folder), "backend": "pytorch", **llm}, vocab))
    deadline = time.monotonic() + 20
    while httpx.get(server.base_url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the engine did not load"
        time.sleep(0.02)
    return server


@pytest.mark.parametrize("stream_interval", [1, 4])
def test_chat_streaming_and_not_on_the_fake(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, stream_interval: int
) -> None:
    folder = model_folder(tmp_path, [ANSWER, ANSWER, CALL, CALL])
    client = client_for(trtllm_server(serve, vocab, folder, stream_interval=stream_interval))
    ask = ASK["messages"]
    answer = {"reasoning": "Easy.", "content": "It is 18C.", "tool_calls": [], "finish_reason": "stop"}
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ask)) == answer
    assert streamed_answer(client.chat.completions.create(model=MODEL, messages=ask, stream=True))[0] == answer
    call = {"reasoning": "Need the weather.", "content": None,
            "tool_calls": [{"name": "get_weather", "arguments": '{"city":"Paris"}'}], "finish_reason": "tool_calls"}
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER])) == call
    streamed, chunks = streamed_answer(client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], stream=True))
    assert streamed == call


def test_sampling_params_sent_to_tensorrt_llm(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder)
    body = {**ASK, "max_tokens": 300, "temperature": 0.5, "top_p": 0.8, "seed": 7, "min_tokens": 3}
    assert httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    generate = [e for e in events(folder) if e["event"] == "generate"][-1]
    sampling = generate["sampling"]
    assert generate["streaming"] is True
    assert {k: sampling[k] for k in ("max_tokens", "temperature", "top_p", "seed", "min_tokens")} == {
        "max_tokens": 300, "temperature": 0.5, "top_p": 0.8, "seed": 7, "min_tokens": 3}
    assert sampling["detokenize"] is False and sampling["include_stop_str_in_output"] is True
    assert sampling["stop_token_ids"] == [200002, 200012] and sampling["ignore_eos"] is False
    httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "ignore_eos": True, "max_tokens": 5}, timeout=30)
    ignoring = [e for e in events(folder) if e["event"] == "generate"][-1]["sampling"]
    assert ignoring["ignore_eos"] is True and ignoring["stop_token_ids"] is None


def test_the_end_token_tensorrt_llm_leaves_out_is_put_back(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder)
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 100, "return_token_ids": True}
    choice = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["token_ids"] == vocab.encode_harmony(ANSWER)  # ends with <|return|>, restored
    assert choice["finish_reason"] == "stop"


def test_cached_prompt_tokens_from_tensorrt_llm(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]))
    first = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
    second = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= second["prompt_tokens"] and cached % 32 == 0


def test_client_disconnect_aborts_the_tensorrt_llm_request(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    long = "<|channel|>final<|message|>" + " word" * 500 + "<|return|>"
    folder = model_folder(tmp_path, [long], step_seconds="0.02")
    server = trtllm_server(serve, vocab, folder)
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={**ASK, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    deadline = time.monotonic() + 5
    while not any(e["event"] == "abort" for e in events(folder)):
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.02)


def test_prompt_too_long_for_the_engine_is_a_400(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]), max_num_tokens=16)
    for stream in (False, True):
        response = httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "stream": stream}, timeout=30)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and "max_num_tokens (16)" in error["message"]


def test_health_is_503_while_the_model_loads_and_after_shutdown(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    from proxy.engines.trtllm import TrtllmEngine

    folder = model_folder(tmp_path, [ANSWER], load_seconds="1.0")
    engine = TrtllmEngine({"model": str(folder)}, vocab)
    server = serve(engine=engine)
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 503
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 503
    deadline = time.monotonic() + 20
    while httpx.get(server.base_url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 200
    server.stop()
    assert [e["event"] for e in events(folder)][-1] == "shutdown"


def test_an_engine_that_is_shutting_down_answers_503(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    import asyncio

    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]))
    asyncio.run(server.engine.close())
    response = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert response.status_code == 503
    with pytest.raises(openai.InternalServerError):
        client_for(server).chat.completions.create(model=MODEL, messages=ASK["messages"])


def test_responses_streaming_and_not_on_the_fake(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    from tests.open_responses import validate_event
    from tests.test_responses import stream_events

    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER, CALL]), stream_interval=3)
    client = client_for(server)
    plain = client.responses.create(model=MODEL, input="Weather?")
    assert plain.output_text == "It is 18C." and plain.status == "completed"
    assert plain.usage.input_tokens_details.cached_tokens == 0
    events = stream_events(server, {"input": "Weather?", "tools": [{"type": "function", "name": "get_weather"}]})
    for event in events:
        validate_event(event)
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "function_call"]
    assert final["output"][1]["arguments"] == '{"city":"Paris"}'
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0  # same prompt prefix as the first request


def test_cancelling_a_background_response_aborts_the_tensorrt_llm_request(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    long = "<|channel|>final<|message|>" + " word" * 500 + "<|return|>"
    folder = model_folder(tmp_path, [long], step_seconds="0.02")
    client = client_for(trtllm_server(serve, vocab, folder))
    job = client.responses.create(model=MODEL, input="long", background=True)
    time.sleep(0.3)
    assert client.responses.cancel(job.id).status == "cancelled"
    assert any(e["event"] == "abort" for e in events(folder))
    assert client.responses.retrieve(job.id).status == "cancelled"


def test_a_request_error_during_generation_is_reported(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER], fail_after="5"))
    plain = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert plain.status_code == 500 and "CUDA out of memory" in plain.json()["error"]["message"]
    with pytest.raises(openai.APIError, match="CUDA out of memory"):
        list(client_for(server).chat.completions.create(model=MODEL, messages=ASK["messages"], stream=True))
    failed = client_for(server).responses.create(model=MODEL, input="hi")
    assert failed.status == "failed" and "CUDA out of memory" in failed.error.message
