"""The TensorRT-LLM engine, end to end on the fake TensorRT-LLM of tests/fake_trtllm (no GPU here).

Every test runs on the oldest and the newest API surface the fake mirrors (tensorrt_llm/_surface.py): the
gpt-oss-dev container (1.0.0rc6) and 2026 main (1.4); tests/test_trtllm_releases.py checks each release's
differences on all six surfaces.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.engines.base import OutputConstraint
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for, message_answer, streamed_answer
from tests.waiting import eventually
from tools.definitions import ToolChoice, make_tool

FAKE = Path(__file__).resolve().parent / "fake_trtllm"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
SURFACES = ("oldest", "newest")


def forget_tensorrt_llm() -> None:
    for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def on_surface(name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fake TensorRT-LLM on the import path, mirroring one release (read when it is first imported)."""
    monkeypatch.setenv("FAKE_TRTLLM_SURFACE", name)
    sys.path.insert(0, str(FAKE))
    forget_tensorrt_llm()
    yield name
    sys.path.remove(str(FAKE))
    forget_tensorrt_llm()


@pytest.fixture(params=SURFACES, autouse=True)
def surface(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from on_surface(request.param, monkeypatch)


def model_folder(tmp_path: Path, completions: list[str], **files: str) -> Path:
    folder = tmp_path / "gpt-oss-fake"
    folder.mkdir()
    (folder / "script.jsonl").write_text("".join(json.dumps({"completion": c}) + "\n" for c in completions))
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def events(folder: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in found if kind is None or e["event"] == kind]


def trtllm_engine(vocab: Any, folder: Path, *flags: str, **yaml_keys: Any) -> Any:
    """The engine for `trtllm-serve FOLDER FLAGS --extra_llm_api_options YAML` (the YAML of `yaml_keys`)."""
    import yaml

    from proxy.engines.trtllm.engine import TrtllmEngine

    command = [str(folder), *flags]
    if yaml_keys:
        path = folder / "extra_llm_api_options.yaml"
        path.write_text(yaml.safe_dump(yaml_keys))
        command += ["--extra_llm_api_options", str(path)]
    return TrtllmEngine(command, vocab)


def loading(engine: Any) -> bool:
    """A TrtllmEngine's LLM is being built in its side thread, or was: its load has not failed."""
    built = engine._loading
    return built is None or not built.done() or built.exception() is None


def wait_loaded(server: LiveServer) -> None:
    """Until the server's TrtllmEngine has loaded (/health says 200), as long as the server runs and the load has
    not failed (a busy machine loads slower; pytest-timeout catches a hang)."""
    eventually(lambda: httpx.get(server.base_url + "/health", timeout=5).status_code == 200,
               still=lambda: server.running() and loading(server.engine), interval=0.02,
               why="the engine's load failed, or the server ended")


def trtllm_server(serve: Callable[..., LiveServer], vocab: Any, folder: Path, *flags: str, **yaml_keys: Any
                  ) -> LiveServer:
    server = serve(engine=trtllm_engine(vocab, folder, *flags, **yaml_keys))
    wait_loaded(server)
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
    stream = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], stream=True)
    assert streamed_answer(stream)[0] == call


@pytest.mark.parametrize("backend", [None, "llguidance"])
def test_sampling_params_sent_to_tensorrt_llm(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, backend: str | None, surface: str
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder, guided_decoding_backend=backend)
    body = {**ASK, "max_tokens": 300, "temperature": 0.5, "top_p": 0.8, "seed": 7, "min_tokens": 3,
            "tools": [WEATHER]}  # tool_choice auto, no strict tool: nothing to enforce
    assert httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    generate = events(folder, "generate")[-1]
    sampling = generate["sampling"]
    assert generate["streaming"] is True and generate["guided"] is None
    assert {k: sampling[k] for k in ("max_tokens", "temperature", "top_p", "seed", "min_tokens")} == {
        "max_tokens": 300, "temperature": 0.5, "top_p": 0.8, "seed": 7, "min_tokens": 3}
    assert sampling["detokenize"] is False and sampling["include_stop_str_in_output"] is True
    # ours, then (from 1.2) the generation config's <|endoftext|> that SamplingParams._setup adds, as for trtllm-serve
    assert sampling["stop_token_ids"] == [200002, 200012] + ([199999] if surface == "newest" else [])
    assert sampling["ignore_eos"] is False and sampling["end_id"] == 200002
    # as trtllm-serve: top_k 0; on 1.0 greedy unless the YAML sets enable_mixed_sampler (NVIDIA's 1.0 YAML does)
    assert generate["decoding"] == ("greedy" if surface == "oldest" else "sampling") and sampling["top_k"] == 0
    httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "ignore_eos": True, "max_tokens": 5}, timeout=30)
    ignoring = [e for e in events(folder) if e["event"] == "generate"][-1]["sampling"]
    # none of ours; from 1.2 the generation config's, as trtllm-serve sends them (2026 drops them with ignore_eos)
    assert ignoring["ignore_eos"] is True
    assert ignoring["stop_token_ids"] == ([199999, 200012] if surface == "newest" else [])
    assert (ignoring["temperature"], ignoring["top_p"], ignoring["top_k"]) == (1.0, 1.0, 0)  # trtllm-serve's


def test_the_end_token_tensorrt_llm_leaves_out_is_put_back(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder)
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 100, "return_token_ids": True}
    choice = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["token_ids"] == vocab.encode_harmony(ANSWER)  # ends with <|return|>, restored
    assert choice["finish_reason"] == "stop"


def test_cached_prompt_tokens_from_tensorrt_llm(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, surface: str
) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]))
    first = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
    second = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
    if surface == "oldest":  # no RequestOutput.cached_tokens before PR #7637: the count is unknown, not zero
        assert "prompt_tokens_details" not in first and "prompt_tokens_details" not in second
        return
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= second["prompt_tokens"] and cached % 32 == 0


def test_a_release_without_cached_tokens_streams_to_the_end(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, surface: str
) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER, CALL]), stream_interval=2)
    stream = client_for(server).chat.completions.create(model=MODEL, messages=ASK["messages"], stream=True,
                                                         stream_options={"include_usage": True})
    answer, chunks = streamed_answer(stream)
    assert answer["content"] == "It is 18C." and answer["finish_reason"] == "stop"
    usage = chunks[-1].usage
    assert usage.completion_tokens == len(vocab.encode_harmony(ANSWER))
    assert (usage.prompt_tokens_details is None) == (surface == "oldest")
    response = client_for(server).responses.create(model=MODEL, input="Weather?", tools=[
        {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}])
    assert response.status == "completed" and response.output[-1].type == "function_call"


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
    eventually(lambda: any(e["event"] == "abort" for e in events(folder)), still=server.running, interval=0.02)


def test_prompt_too_long_for_the_engine_is_a_400(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]), max_num_tokens=16)
    for stream in (False, True):
        response = httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "stream": stream}, timeout=30)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and "takes at most 16" in error["message"]


def test_health_is_503_while_the_model_loads_and_after_shutdown(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER], load_seconds="1.0")
    engine = trtllm_engine(vocab, folder)
    server = serve(engine=engine)
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 503
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 503
    wait_loaded(server)
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 200
    server.stop()
    assert [e["event"] for e in events(folder)][-1] == "shutdown"


def test_an_engine_that_is_shutting_down_answers_503(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    import asyncio

    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]))
    asyncio.run(server.engine.close())
    response = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert response.status_code == 503
    with pytest.raises(openai.InternalServerError):
        client_for(server).chat.completions.create(model=MODEL, messages=ASK["messages"])


def test_responses_streaming_and_not_on_the_fake(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, surface: str
) -> None:
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
    cached = final["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > 0 if surface == "newest" else cached == 0  # same prompt prefix as the first request


def test_cancelling_a_background_response_aborts_the_tensorrt_llm_request(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    long = "<|channel|>final<|message|>" + " word" * 500 + "<|return|>"
    folder = model_folder(tmp_path, [long], step_seconds="0.02")
    client = client_for(trtllm_server(serve, vocab, folder))
    job = client.responses.create(model=MODEL, input="long", background=True)
    eventually(lambda: events(folder, "generate"), interval=0.05,  # running in TensorRT-LLM (10 s of steps)
               still=lambda: client.responses.retrieve(job.id).status in ("queued", "in_progress"))
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


# Output constraints: what reaches TensorRT-LLM, per backend and release.

REQUIRED = {**ASK, "tools": [WEATHER], "tool_choice": "required"}
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
        "required": ["city", "celsius"], "additionalProperties": False}


def required_call_grammar() -> Any:
    """The grammar the server builds for REQUIRED, from the same declaration."""
    function = WEATHER["function"]
    tool = make_tool(function["name"], function["description"], function["parameters"], None, "tools[0]")
    return OutputConstraint((tool,), ToolChoice("required")).grammar


@pytest.mark.parametrize(
    ("backend", "xgrammar", "field"),
    [
        ("llguidance", "0.1.21", "grammar"),
        ("llguidance", "0.1.25", "grammar"),
        ("xgrammar", "0.1.21", None),  # 1.0 and 1.1.0rc: legacy structural tags only
        ("xgrammar", "0.1.25", "structural_tag"),  # PR #7893 passed the new form and pinned 0.1.25
        (None, "0.1.25", None),
    ],
)
def test_the_form_each_backend_and_release_takes(backend: str | None, xgrammar: str, field: str | None) -> None:
    from proxy.engines.trtllm.harmony import guided_decoding

    plan = guided_decoding(backend, xgrammar)
    assert plan.field == field
    assert ("are enforced" in plan.message) == (field is not None)
    if backend == "xgrammar" and field is None:
        assert "legacy structures/triggers form" in plan.message and "llguidance" in plan.message
    assert "speculative_config" in guided_decoding(None, xgrammar, speculative=True).message


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_a_required_call_reaches_tensorrt_llm_in_the_form_its_backend_takes(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, surface: str, backend: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy")
    folder = model_folder(tmp_path, [CALL])
    server = trtllm_server(serve, vocab, folder, guided_decoding_backend=backend)
    answer = message_answer(client_for(server).chat.completions.create(**REQUIRED))
    assert answer["tool_calls"] == [{"name": "get_weather", "arguments": '{"city":"Paris"}'}]
    grammar, guided = required_call_grammar(), events(folder, "generate")[-1]["guided"]
    log = caplog.text
    if backend == "llguidance":  # the Lark grammar of the whole completion, in every release
        assert guided == {"grammar": grammar.lark}
        assert not events(folder, "guide_rejected")  # the real matcher, as TensorRT-LLM wraps it, took the call
        assert "enforced by TensorRT-LLM's llguidance backend" in log
    elif surface == "newest":  # xgrammar >= 0.1.25 compiles the `format` structural tag
        assert guided == {"structural_tag": json.dumps(grammar.structural_tag, separators=(",", ":"))}
        assert json.loads(guided["structural_tag"])["type"] == "structural_tag"
        assert "enforced by TensorRT-LLM's xgrammar backend" in log
    else:  # 1.0 reads only legacy structures/triggers: sending the new form would fail the request
        assert guided is None
        assert "NOT enforced" in log and "legacy structures/triggers form" in log and "llguidance" in log
        assert f"{grammar.summary}, NOT enforced" in log  # and said for the request too


def test_prose_where_a_call_is_required_is_what_the_sent_grammar_rejects(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER])  # a "model" that answers instead of calling
    server = trtllm_server(serve, vocab, folder, guided_decoding_backend="llguidance")
    httpx.post(server.base_url + "/v1/chat/completions", json=REQUIRED, timeout=30)
    rejected = events(folder, "guide_rejected")
    assert len(rejected) == 1
    tokens = vocab.encode_harmony(ANSWER)
    assert vocab.decode(tokens[rejected[0]["index"]:]).startswith("final")  # the final channel, first refused


def test_a_json_answer_is_constrained_on_the_responses_path(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    good = '{"city":"Paris","celsius":18}'
    folder = model_folder(tmp_path, [f"<|channel|>final<|message|>{s}<|return|>" for s in (good, '{"city":"Paris"}')])
    server = trtllm_server(serve, vocab, folder, guided_decoding_backend="llguidance")
    text = {"format": {"type": "json_schema", "name": "weather", "schema": CITY, "strict": True}}
    first = client_for(server).responses.create(model=MODEL, input="Weather?", text=text)
    assert json.loads(first.output_text) == {"city": "Paris", "celsius": 18}
    guided = events(folder, "generate")[-1]["guided"]
    assert set(guided) == {"grammar"} and '"celsius"' in guided["grammar"]
    assert not events(folder, "guide_rejected")
    client_for(server).responses.create(model=MODEL, input="Weather?", text=text)  # the script misses "celsius"
    assert [e["request_id"] for e in events(folder, "guide_rejected")] == [2]


def test_without_a_backend_constraints_are_said_not_sent(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy")
    folder = model_folder(tmp_path, [CALL])
    server = trtllm_server(serve, vocab, folder)  # guided_decoding_backend unset: TensorRT-LLM would ignore a guide
    assert "NOT enforced" in caplog.text and "no guided_decoding_backend" in caplog.text
    answer = message_answer(client_for(server).chat.completions.create(**REQUIRED))
    assert answer["finish_reason"] == "tool_calls"  # the prompt still asks for the call
    assert events(folder, "generate")[-1]["guided"] is None
    assert f"{required_call_grammar().summary}, NOT enforced" in caplog.text


def test_a_guide_the_backend_refuses_fails_the_request_in_the_fake(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, surface: str
) -> None:
    """The fake refuses what the real grammar matchers refuse, so a wrong form could not pass these tests."""
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import GuidedDecodingParams

    with pytest.raises(ValueError, match="Only one guide can be used for a request, but got 2"):
        SamplingParams(guided_decoding=GuidedDecodingParams(grammar="start: /x/", json_object=True))
    folder = model_folder(tmp_path, [ANSWER])
    with pytest.raises(ValueError, match="Input should be 'xgrammar' or 'llguidance'"):
        LLM(str(folder), guided_decoding_backend="outlines")
    from tensorrt_llm.llmapi.llm_args import EagleDecodingConfig

    eagle = EagleDecodingConfig(max_draft_len=3)
    speculative = {"guided_decoding_backend": "xgrammar", "speculative_config": eagle}
    if surface == "oldest":
        with pytest.raises(ValueError, match="not supported with speculative decoding"):
            LLM(str(folder), **speculative)
    else:
        LLM(str(folder), **speculative).shutdown()
    grammar = required_call_grammar()
    refused = {  # backend: a guide it does not take
        "llguidance": GuidedDecodingParams(structural_tag=json.dumps(grammar.structural_tag)),
        "xgrammar": GuidedDecodingParams(structural_tag=json.dumps(
            {"structures": [{"begin": "<|channel|>", "schema": {}, "end": "<|call|>"}], "triggers": ["<|channel|>"]}
            if surface == "newest" else grammar.structural_tag)),
    }
    for backend, guide in refused.items():
        llm = LLM(str(folder), guided_decoding_backend=backend)
        with pytest.raises(RuntimeError, match="Guided decoding failed"):
            asyncio.run(drain(llm, SamplingParams(max_tokens=5, guided_decoding=guide)))
        llm.shutdown()


async def drain(llm: Any, params: Any) -> None:
    async for _ in llm.generate_async([1, 2, 3], params, streaming=True):
        pass
