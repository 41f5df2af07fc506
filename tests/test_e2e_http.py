"""The HTTP surface over raw HTTP: exact SSE chunk shapes, error statuses and bodies, cancellation."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from proxy.engines.base import EngineError
from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Cached, Failing, Recording, SlowStart, Unhealthy
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for
from tests.waiting import eventually

ASK = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def sse_payloads(response: httpx.Response) -> list[str]:
    """The data payloads of an SSE response, in order (comment lines such as pings skipped)."""
    payloads = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payloads.append(line[len("data: ") :])
        else:
            assert line == "" or line.startswith(":"), line
    return payloads


def test_raw_stream_has_the_exact_chunk_shapes(serve: Callable[..., LiveServer]) -> None:
    preamble_and_call = (
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
        "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
    )
    server = serve(completions=[preamble_and_call])
    body = {**ASK, "tools": [WEATHER], "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    head = {k: chunks[0][k] for k in ("id", "created", "model")}
    assert head["id"].startswith("chatcmpl-") and head["model"] == MODEL
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert {k: chunk[k] for k in head} == head
        assert "usage" in chunk  # null on every chunk but the last when include_usage is set
    *choice_chunks, usage_chunk = chunks
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    deltas = [c["choices"][0]["delta"] for c in choice_chunks]
    assert deltas[0] == {"role": "assistant", "content": "", "refusal": None}
    assert [c["choices"][0]["finish_reason"] for c in choice_chunks] == [None] * (len(deltas) - 1) + ["tool_calls"]
    assert deltas[-1] == {}
    assert all("reasoning_content" not in d for d in deltas)  # only the configured field, never the other
    assert "".join(d.get("reasoning", "") for d in deltas) == "Think."
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    announce, *fragments = calls
    call_id = announce[0]["id"]
    assert announce == [
        {"index": 0, "id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    ]
    assert call_id.startswith("call_") and fragments
    for fragment in fragments:
        assert fragment == [{"index": 0, "function": {"arguments": fragment[0]["function"]["arguments"]}}]
    assert "".join(f[0]["function"]["arguments"] for f in fragments) == '{"city": "Paris"}'


def test_non_streaming_body_sends_one_reasoning_field(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER])
    body = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It is 18C.", "refusal": None, "reasoning": "Easy."}


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({**ASK, "model": "gpt-4o"}, 404, "model", "model_not_found"),
        ({**ASK, "foo": 1}, 400, "foo", None),
        ({"model": MODEL}, 400, "messages", "missing_required_parameter"),
        ({**ASK, "messages": []}, 400, "messages", None),
        ({**ASK, "reasoning_effort": "ultra"}, 400, "reasoning_effort", "invalid_value"),
        ({**ASK, "chat_template_kwargs": {"reasoning_effort": "extreme"}}, 400,
         "chat_template_kwargs.reasoning_effort", "invalid_value"),
        ({**ASK, "chat_template_args": {"reasoning_effort": 3}}, 400, "chat_template_args.reasoning_effort",
         "invalid_value"),
        ({**ASK, "chat_template_kwargs": {"enable_thinking": True}}, 400, "chat_template_kwargs.enable_thinking", None),
        ({**ASK, "n": 2}, 400, "n", "unsupported_parameter"),
        ({**ASK, "temperature": 3}, 400, "temperature", "decimal_above_max_value"),  # OpenAI's code
        ({**ASK, "max_tokens": "ten"}, 400, "max_tokens", None),
        ({**ASK, "max_tokens": 10, "max_completion_tokens": 20}, 400, "max_completion_tokens", None),
        ({**ASK, "frequency_penalty": 0.5}, 400, "frequency_penalty", "unsupported_parameter"),
        ({**ASK, "logprobs": True}, 400, "logprobs", "unsupported_parameter"),
        ({**ASK, "functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
        ({**ASK, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         400, "messages[0].content[0]", "unsupported_content"),
        ({**ASK, "messages": [{"role": "user"}]}, 400, "messages[0].content", "missing_required_parameter"),
        ({**ASK, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
        ({**ASK, "messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}, 400,
         "messages[0].tool_call_id", None),
        ({**ASK, "messages": [{"role": "assistant", "reasoning": "a", "reasoning_content": "b"}]}, 400,
         "messages[0].reasoning", None),
        ({**ASK, "tools": [{"type": "function", "function": {"name": "bad name"}}]}, 400, "tools[0].function.name",
         None),
        ({**ASK, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
         400, "tools[0].function.parameters", None),
        ({**ASK, "tools": [WEATHER, WEATHER]}, 400, "tools[1].name", None),
        ({**ASK, "tools": [{"type": "web_search"}]}, 400, "tools[0].type", "invalid_value"),
        ({**ASK, "tool_choice": {"type": "function", "function": {"name": "missing"}}, "tools": [WEATHER]}, 400,
         "tool_choice", None),
        ({**ASK, "tool_choice": "required"}, 400, "tool_choice", None),
        ({**ASK, "max_tokens": 200_000}, 400, "max_tokens", "context_length_exceeded"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    serve: Callable[..., LiveServer], body: dict[str, Any], status: int, param: str | None, code: str | None
) -> None:
    server = serve(completions=[ANSWER])
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == code
    assert error["message"] and "Traceback" not in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("method", "path", "content", "status"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400),
        ("POST", "/v1/chat/completions", b"\xff\xfe", 400),
        ("GET", "/v1/chat/completions", None, 405),
        ("GET", "/v1/nothing", None, 404),
        ("GET", "/v1/models/gpt-4o", None, 404),
    ],
)
def test_malformed_requests_and_unknown_routes(
    serve: Callable[..., LiveServer], method: str, path: str, content: bytes | None, status: int
) -> None:
    server = serve(completions=[ANSWER])
    response = httpx.request(method, server.base_url + path, content=content, timeout=30)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_client_raises_typed_errors(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve(completions=[ANSWER]))
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    assert f"This server serves `{MODEL}` (set by --served-model-name)" in missing.value.message  # what to send
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], reasoning_effort="big")
    assert bad.value.param == "reasoning_effort"


def test_engine_refusing_before_the_first_token_is_an_http_error(serve: Callable[..., LiveServer], vocab: Any) -> None:
    error = EngineError("The prompt is longer than the engine allows.", status=400, code="context_length_exceeded")
    server = serve(engine=Failing(scripted_engine(vocab, [ANSWER]), error, after=0))
    for stream in (False, True):
        response = httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "stream": stream}, timeout=30)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "context_length_exceeded"


def test_engine_failing_mid_stream_sends_an_error_event(serve: Callable[..., LiveServer], vocab: Any) -> None:
    error = EngineError("the GPU fell over", status=500, code="engine_error")
    server = serve(engine=Failing(scripted_engine(vocab, [ANSWER]), error, after=8))
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={**ASK, "stream": True}, timeout=30) as r:
        payloads = sse_payloads(r)
    assert payloads[-1] == "[DONE]"
    assert json.loads(payloads[-2]) == {
        "error": {"message": "the GPU fell over", "type": "server_error", "param": None, "code": "engine_error"}
    }
    with pytest.raises(openai.APIError, match="GPU fell over"):
        list(client_for(server).chat.completions.create(model=MODEL, messages=ASK["messages"], stream=True))
    plain = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert plain.status_code == 500 and plain.json()["error"]["message"] == "the GPU fell over"


def test_cached_prompt_tokens_are_reported_when_the_engine_knows(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=Cached(scripted_engine(vocab, [ANSWER]), cached=32))
    usage = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 32}


def long_completion(words: int = 400) -> str:
    return "<|channel|>final<|message|>" + " word" * words + "<|return|>"


def ended(engine: Recording) -> None:
    """Until the engine's stream ended, closed early (`cancelled`) or run to its end (`finished`): however slowly a
    busy machine runs it, one of them comes, and the test says which it had to be."""
    eventually(lambda: engine.cancelled.is_set() or engine.finished.is_set())


def test_client_disconnect_mid_stream_cancels_the_engine_request(
    serve: Callable[..., LiveServer], vocab: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    engine = Recording(scripted_engine(vocab, [long_completion()], token_delay=0.02))
    server = serve(engine=engine)
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={**ASK, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    # The client is gone after 3 of 400 tokens: the engine's stream must be closed, not run to the end (the
    # control: a stream nobody closed runs to its end in 8 s, however slowly).
    ended(engine)
    assert engine.cancelled.is_set() and not engine.finished.is_set()
    eventually(lambda: any("cancelled after" in rec.getMessage() for rec in caplog.records), interval=0.02)
    cancelled = [rec.getMessage() for rec in caplog.records if "cancelled after" in rec.getMessage()]
    assert cancelled and int(cancelled[0].split("after ")[1].split()[0]) < 100


def test_client_disconnect_during_a_non_streaming_request_cancels_it(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    engine = Recording(scripted_engine(vocab, [long_completion()], token_delay=0.02))
    server = serve(engine=engine)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=0.3)
    ended(engine)
    assert engine.cancelled.is_set() and not engine.finished.is_set()


def test_health_is_503_until_the_engine_is_ready(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = SlowStart(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    health = httpx.get(server.base_url + "/health", timeout=30)
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_starting"
    chat = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert chat.status_code == 503 and "retry-after" in chat.headers
    engine.release.set()
    eventually(lambda: httpx.get(server.base_url + "/health", timeout=30).status_code == 200, interval=0.02)
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 200


def test_health_reports_an_engine_that_cannot_serve(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=Unhealthy(scripted_engine(vocab, [ANSWER])))
    health = httpx.get(server.base_url + "/health", timeout=30)
    assert health.status_code == 503 and "not answering" in health.json()["error"]["message"]


def test_models_list_and_retrieve(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], served_model_name="my/gpt-oss")
    client = client_for(server)
    assert [m.id for m in client.models.list()] == ["my/gpt-oss"]
    assert client.models.retrieve("my/gpt-oss").owned_by == "openai"
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 404


def test_tokenize_shows_the_rendered_prompt(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=[ANSWER])
    body = {**ASK, "tools": [WEATHER], "reasoning_effort": "high"}
    result = httpx.post(server.base_url + "/tokenize", json=body, timeout=30).json()
    assert result["count"] == len(result["tokens"])
    assert result["prompt"] == vocab.decode(result["tokens"])
    assert "Reasoning: high" in result["prompt"] and "type get_weather" in result["prompt"]
    assert result["prompt"].endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")
    bad = httpx.post(server.base_url + "/tokenize", json={**body, "reasoning_effort": "x"}, timeout=30)
    assert bad.status_code == 400


@pytest.mark.parametrize("after", [0, 6])
def test_an_engine_bug_is_a_clean_error_without_internals(
    serve: Callable[..., LiveServer], vocab: Any, after: int
) -> None:
    bug = KeyError("internal detail that must not reach the client")
    server = serve(engine=Failing(scripted_engine(vocab, [ANSWER]), bug, after=after))
    plain = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert plain.status_code == 500
    assert plain.json()["error"]["code"] == "engine_error" and "internal detail" not in plain.text
    streamed = httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "stream": True}, timeout=30)
    assert "internal detail" not in streamed.text
    if after == 0:  # before the first token: an HTTP error
        assert streamed.status_code == 500
    else:  # after it: an error event, then [DONE]
        payloads = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert payloads[-1] == "[DONE]" and json.loads(payloads[-2])["error"]["code"] == "engine_error"
    responses = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, "input": "hi"}, timeout=30)
    body = responses.json()
    assert (responses.status_code, body.get("status")) in ((200, "failed"), (500, None))
    assert "internal detail" not in responses.text
    raw = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": [1]}, timeout=30)
    assert raw.status_code == 500 and "internal detail" not in raw.text


def test_api_key_protects_v1_routes_but_not_health(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], api_key="sk-local")
    missing = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client_for(server).models.list()  # the helper sends the key "unused"
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sk-local", max_retries=0)
    assert client.chat.completions.create(model=MODEL, messages=ASK["messages"]).choices[0].message.content
    assert [e.type for e in client.responses.create(model=MODEL, input="hi", stream=True)][-1] == "response.completed"
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200


def test_concurrent_streams_do_not_mix(serve: Callable[..., LiveServer]) -> None:
    import asyncio

    server = serve(completions=[ANSWER, CALL], token_delay=0.002)

    async def one(client: openai.AsyncOpenAI) -> tuple[str, str]:
        stream = await client.chat.completions.create(model=MODEL, messages=ASK["messages"], stream=True)
        content, arguments = [], []
        async for chunk in stream:
            for choice in chunk.choices:
                content.append(choice.delta.content or "")
                arguments += [(c.function.arguments or "") for c in choice.delta.tool_calls or [] if c.function]
        return "".join(content), "".join(arguments)

    async def many() -> list[tuple[str, str]]:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(client) for _ in range(24)))

    results = asyncio.run(many())
    assert sorted(set(results)) == [("", '{"city":"Paris"}'), ("It is 18C.", "")]
    assert results.count(("It is 18C.", "")) == 12  # the script alternates, one line per request
