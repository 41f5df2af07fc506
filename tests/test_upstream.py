"""The upstream engine, end to end: a harmony-proxy in front of other servers' /v1/completions."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from proxy.engines.base import EngineError
from proxy.engines.scripted import scripted_engine
from proxy.engines.upstream import UpstreamEngine
from tests.conftest import MODEL, LiveServer
from tests.engines import Failing, Recording
from tests.fake_upstreams import fake_upstream
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for, message_answer, streamed_answer

ASK = [{"role": "user", "content": "Weather in Paris?"}]
ANSWERED = {"reasoning": "Easy.", "content": "It is 18C.", "tool_calls": [], "finish_reason": "stop"}
CALLED = {"reasoning": "Need the weather.", "content": None, "finish_reason": "tool_calls",
          "tool_calls": [{"name": "get_weather", "arguments": '{"city":"Paris"}'}]}


def dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def front(serve: Callable[..., LiveServer], vocab: Any, urls: list[str], **options: Any) -> LiveServer:
    return serve(engine=UpstreamEngine(vocab, urls, MODEL, **options))


def test_chat_through_a_front_server_matches_the_back_server(serve: Callable[..., LiveServer], vocab: Any) -> None:
    back_engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER, CALL, CALL]))
    back = serve(engine=back_engine)
    proxy = front(serve, vocab, [back.base_url + "/v1"])
    client = client_for(proxy)
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK)) == ANSWERED
    assert streamed_answer(client.chat.completions.create(model=MODEL, messages=ASK, stream=True))[0] == ANSWERED
    tools = [WEATHER]
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK, tools=tools)) == CALLED
    streamed, _ = streamed_answer(client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, stream=True))
    assert streamed == CALLED
    # The back server generated from exactly the prompt the front server rendered.
    rendered = httpx.post(proxy.base_url + "/tokenize", json={"model": MODEL, "messages": ASK, "tools": tools}).json()
    assert back_engine.requests[-1].prompt_token_ids == rendered["tokens"]
    usage = client.chat.completions.create(model=MODEL, messages=ASK).usage
    assert usage.prompt_tokens == len(httpx.post(proxy.base_url + "/tokenize",
                                                 json={"model": MODEL, "messages": ASK}).json()["tokens"])


def test_cancel_propagates_to_the_back_server(serve: Callable[..., LiveServer], vocab: Any) -> None:
    long = "<|channel|>final<|message|>" + " word" * 500 + "<|return|>"
    back_engine = Recording(scripted_engine(vocab, [long], token_delay=0.02))
    back = serve(engine=back_engine)
    proxy = front(serve, vocab, [back.base_url + "/v1"])
    body = {"model": MODEL, "messages": ASK, "stream": True}
    with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    assert back_engine.cancelled.wait(timeout=5)
    assert not back_engine.finished.is_set()


def test_failover_and_round_robin(serve: Callable[..., LiveServer], vocab: Any) -> None:
    first = Recording(scripted_engine(vocab, [ANSWER]))
    second = Recording(scripted_engine(vocab, [ANSWER]))
    urls = [dead_url(), serve(engine=first).base_url + "/v1", dead_url(), serve(engine=second).base_url + "/v1"]
    client = client_for(front(serve, vocab, urls))
    for _ in range(4):
        assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK)) == ANSWERED
    assert len(first.requests) == 2 and len(second.requests) == 2  # the dead ones were skipped, the live ones shared


def test_all_upstreams_down_is_a_503_that_names_them_without_credentials(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    secret_url = dead_url().replace("http://", "http://admin:hunter2@") + "?token=qwerty#frag"
    proxy = front(serve, vocab, [secret_url, dead_url()], api_key="sk-very-secret")
    response = httpx.post(proxy.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=30)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "upstream_unavailable" and "connection failed" in error["message"]
    assert "127.0.0.1" in error["message"]
    health = httpx.get(proxy.base_url + "/health", timeout=30)
    assert health.status_code == 503 and "No upstream is reachable" in health.json()["error"]["message"]
    for text in (response.text, health.text):
        assert "hunter2" not in text and "admin" not in text and "sk-very-secret" not in text and "qwerty" not in text


def test_upstream_failing_mid_stream_is_an_error_never_a_silent_cut(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    back = serve(engine=Failing(scripted_engine(vocab, [ANSWER]), EngineError("GPU fault", 500), after=6))
    client = client_for(front(serve, vocab, [back.base_url + "/v1"]))
    with pytest.raises(openai.APIError, match="GPU fault"):
        list(client.chat.completions.create(model=MODEL, messages=ASK, stream=True))
    with pytest.raises(openai.APIStatusError) as plain:
        client.chat.completions.create(model=MODEL, messages=ASK)
    assert plain.value.status_code == 502 and "GPU fault" in plain.value.message


def test_a_request_the_upstream_refuses_is_passed_back(serve: Callable[..., LiveServer], vocab: Any) -> None:
    back = serve(completions=[ANSWER], max_model_len=300)
    proxy = front(serve, vocab, [back.base_url + "/v1"])
    response = httpx.post(proxy.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=30)
    assert response.status_code == 400
    assert "maximum context length is 300" in response.json()["error"]["message"]


@pytest.mark.parametrize("flavor", ["trtllm", "dynamo", "text"])
def test_upstream_flavors(serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
                          flavor: str) -> None:
    for completion, expected in ((ANSWER, ANSWERED), (CALL, CALLED)):
        app = fake_upstream(vocab, flavor, completion, api_key="sk-key")
        upstream = serve_app(app)
        engine_flavor = "vllm" if flavor == "text" else flavor
        proxy = front(serve, vocab, [upstream.base_url + "/v1"], flavor=engine_flavor, api_key="sk-key")
        client = client_for(proxy)
        assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])) == expected
        streamed, _ = streamed_answer(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                                     stream=True))
        assert streamed == expected
        body = app.state.seen[-1]
        assert body["prompt"] and all(isinstance(t, int) for t in body["prompt"])
        assert body["stop_token_ids"] == [200002, 200012] and body["stream"] is True
        usage = client.chat.completions.create(model=MODEL, messages=ASK).usage
        assert usage.prompt_tokens_details.cached_tokens == 64
        # Token ids pass through whole, the final stop token included even where the upstream left it out.
        raw = httpx.post(proxy.base_url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": [1, 2, 3], "max_tokens": 200, "return_token_ids": True}).json()["choices"][0]
        assert raw["token_ids"] == vocab.encode_harmony(completion) and raw["finish_reason"] == "stop"


def test_dynamo_error_events_become_errors(serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer],
                                          vocab: Any) -> None:
    upstream = serve_app(fake_upstream(vocab, "dynamo", ANSWER, fail_after=5))
    client = client_for(front(serve, vocab, [upstream.base_url + "/v1"], flavor="dynamo"))
    with pytest.raises(openai.APIError, match="the worker died"):
        list(client.chat.completions.create(model=MODEL, messages=ASK, stream=True))


def test_health_is_ok_while_one_upstream_answers(serve: Callable[..., LiveServer], vocab: Any) -> None:
    back = serve(completions=[ANSWER])
    proxy = front(serve, vocab, [dead_url(), back.base_url + "/v1"])
    deadline = time.monotonic() + 10
    while httpx.get(proxy.base_url + "/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize(("status", "ours"), [(400, 400), (422, 400), (401, 502), (404, 502), (500, 502)])
def test_upstream_refusals_map_to_the_party_at_fault(serve: Callable[..., LiveServer],
                                                     serve_app: Callable[[Any], LiveServer], vocab: Any,
                                                     status: int, ours: int) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def refuse(request: Any) -> JSONResponse:
        return JSONResponse({"error": {"message": f"no ({status})"}}, status_code=status)

    upstream = serve_app(Starlette(routes=[Route("/v1/completions", refuse, methods=["POST"])]))
    response = httpx.post(front(serve, vocab, [upstream.base_url + "/v1"]).base_url + "/v1/chat/completions",
                          json={"model": MODEL, "messages": ASK}, timeout=30)
    assert response.status_code == ours and f"no ({status})" in response.json()["error"]["message"]


def test_steps_that_arrive_together_become_one_chunk(
    serve_app: Callable[[Any], LiveServer], serve: Callable[..., LiveServer], vocab: Any
) -> None:
    """An upstream that ran ahead sends many events in one write: they are one step, so one streamed chunk."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    tokens = vocab.encode_harmony("<|channel|>final<|message|>" + "word " * 40 + "<|return|>")
    events = b"".join(
        b"data: " + json.dumps({"choices": [{"index": 0, "text": "", "token_ids": [token],
                                             "finish_reason": "stop" if last else None}]}).encode() + b"\n\n"
        for last, token in ((i == len(tokens) - 1, t) for i, t in enumerate(tokens))
    ) + b"data: [DONE]\n\n"

    async def completions(request: Any) -> Response:
        return Response(events, media_type="text/event-stream")  # every event in one write

    async def models(request: Any) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    upstream = serve_app(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                                           Route("/v1/models", models)]))
    proxy = front(serve, vocab, [upstream.base_url + "/v1"])
    client = client_for(proxy)
    chunks = [c for c in client.chat.completions.create(model=MODEL, messages=ASK, stream=True)
              if c.choices and c.choices[0].delta.content]
    assert len(chunks) < 5  # 41 tokens of text, far fewer chunks
    assert "".join(c.choices[0].delta.content for c in chunks) == client.chat.completions.create(
        model=MODEL, messages=ASK).choices[0].message.content
