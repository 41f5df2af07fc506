"""The upstream engine, end to end: a harmony-proxy in front of other servers' /v1/completions."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from proxy.engines.base import EngineError
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import scripted_engine
from proxy.engines.upstream.engine import UpstreamEngine
from tests.conftest import MODEL, LiveServer
from tests.engines import Failing, Recording
from tests.fake_upstreams import fake_upstream
from tests.grammars import session_matchers
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for, message_answer, streamed_answer
from tests.waiting import eventually

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


def test_a_json_format_through_a_front_server_is_enforced_by_the_back_server(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    """harmony-proxy behind harmony-proxy: the front sends the final answer's schema in `structured_outputs.json`
    (its default for this flavor) and the back server's engine generates under it."""
    back_engine = Recording(mock_engine(vocab, matchers=session_matchers(vocab)))
    back = serve(engine=back_engine)
    proxy = front(serve, vocab, [back.base_url + "/v1"])
    reply = client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, response_format=JSON_FORMAT)
    schema = JSON_FORMAT["json_schema"]["schema"]
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    constraint = back_engine.requests[-1].constraint
    assert constraint.response_format is not None and constraint.response_format.schema == schema
    # What the back server cannot enforce is refused, not dropped.
    refused = httpx.post(back.base_url + "/v1/completions", json={
        "model": MODEL, "prompt": [1, 2], "structured_outputs": {"grammar": "start: /x/"}})
    assert refused.status_code == 400 and "structured_outputs" in refused.json()["error"]["message"]


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
    # Closed early, not run to its end (the control: 10 s at 20 ms a token, however slowly).
    eventually(lambda: back_engine.cancelled.is_set() or back_engine.finished.is_set())
    assert back_engine.cancelled.is_set() and not back_engine.finished.is_set()


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


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "trtllm", "dynamo", "text"])
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
        assert not GUIDED_KEYS & set(body)  # tools with tool_choice auto, none strict: nothing to enforce
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
    eventually(lambda: httpx.get(proxy.base_url + "/health", timeout=30).status_code == 200, interval=0.05)


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


def test_steps_that_arrive_together_are_handed_on_a_bounded_step_at_a_time(
    serve_app: Callable[[Any], LiveServer], serve: Callable[..., LiveServer], vocab: Any
) -> None:
    """An upstream that ran ahead sends many events in one write: they are handed on in steps of at most STEP_BYTES
    (one a turn of the event loop, fair to the other streams), so in a few streamed chunks, not one per token."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from proxy.engines.upstream.http import STEP_BYTES

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
    steps = -(-len(events) // STEP_BYTES)  # 4,115 bytes: 5 steps (the first holds the header tokens too)
    assert 2 <= len(chunks) <= steps < 10  # 41 tokens of text, far fewer chunks
    assert "".join(c.choices[0].delta.content for c in chunks) == client.chat.completions.create(
        model=MODEL, messages=ASK).choices[0].message.content


# Output constraints: each flavor's own field, in the dialect of the upstream's grammar backend.

REPORT = {"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
          "required": ["city", "celsius"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
JSON_ANSWER = ('<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>'
               '{"city":"Paris","celsius":18}<|return|>')
REQUIRED = {"tools": [WEATHER], "tool_choice": "required"}
STRICT_WEATHER = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
ENFORCED_CALLS = [  # (flavor, --upstream-guided-decoding, the grammar where the real server reads it)
    ("vllm", "xgrammar", lambda body, g: json.loads(body["structured_outputs"]["structural_tag"]) == g.structural_tag),
    ("vllm", "llguidance", lambda body, g: body["structured_outputs"] == {"grammar": g.lark}),
    ("sglang", None, lambda body, g: body["response_format"] == g.structural_tag),
    ("sglang", "llguidance", lambda body, g: body["ebnf"] == g.lark),
    ("trtllm", None, lambda body, g: body["response_format"] == g.structural_tag),
    ("trtllm", "llguidance", lambda body, g: body["response_format"] == {"type": "ebnf", "ebnf": g.lark}),
    ("dynamo", "llguidance", lambda body, g: body["guided_grammar"] == g.lark),
]
ENFORCED_JSON = [  # the final answer's schema alone, for upstreams that apply it after the reasoning
    ("vllm", None, lambda body: body["structured_outputs"] == {"json": REPORT}),
    ("sglang", "final-json", lambda body: json.loads(body["json_schema"]) == REPORT),
    ("trtllm", "final-json", lambda body: body["response_format"] == {"type": "json", "schema": REPORT}),
    ("dynamo", None, lambda body: body["guided_json"] == REPORT),
]
GUIDED_KEYS = {"structured_outputs", "response_format", "ebnf", "json_schema", "regex", "guided_json",
               "guided_grammar"}


def constrained_front(serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
                      flavor: str, completion: str, mode: str | None) -> tuple[Any, Recording, LiveServer]:
    """A fake upstream of `flavor` scripted with `completion`, and a front server on it (its engine recorded)."""
    app = fake_upstream(vocab, flavor, completion)
    upstream = serve_app(app)
    engine = Recording(UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, flavor, guided_decoding=mode))
    return app, engine, serve(engine=engine)


@pytest.mark.parametrize(("flavor", "mode", "carries"), ENFORCED_CALLS)
def test_a_required_call_travels_as_the_whole_completions_grammar(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
    flavor: str, mode: str | None, carries: Callable[[dict[str, Any], Any], bool],
) -> None:
    app, engine, proxy = constrained_front(serve, serve_app, vocab, flavor, CALL, mode)
    client = client_for(proxy)
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK, **REQUIRED)) == CALLED
    streamed, _ = streamed_answer(client.chat.completions.create(model=MODEL, messages=ASK, stream=True, **REQUIRED))
    assert streamed == CALLED
    for body, request in zip(app.state.seen, engine.requests, strict=True):
        grammar = request.constraint.grammar
        assert grammar is not None and "get_weather required" in grammar.summary
        assert carries(body, grammar)  # the request's own grammar, where this server reads it (the fake ran it)
    # Without a constraint nothing is sent, so unconstrained requests cost nothing and reach any server.
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])) == CALLED
    assert not GUIDED_KEYS & set(app.state.seen[-1])


@pytest.mark.parametrize(("flavor", "mode", "carries"), ENFORCED_JSON)
def test_a_json_final_answer_travels_as_its_schema(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
    flavor: str, mode: str | None, carries: Callable[[dict[str, Any]], bool], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy.engine")
    app, _, proxy = constrained_front(serve, serve_app, vocab, flavor, JSON_ANSWER, mode)
    reply = client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, response_format=JSON_FORMAT)
    assert json.loads(reply.choices[0].message.content) == {"city": "Paris", "celsius": 18}
    assert carries(app.state.seen[-1])
    # All of this constraint was carried: nothing is logged as unenforced for the request.
    assert not [r for r in caplog.records if reply.id in r.getMessage()]


def test_the_fake_refuses_completions_the_grammar_forbids(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    """The fakes really check the constraint: prose where a call is required, a final answer off its schema."""
    _, _, proxy = constrained_front(serve, serve_app, vocab, "vllm", ANSWER, "llguidance")
    with pytest.raises(openai.APIStatusError) as refused:
        client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, **REQUIRED)
    assert refused.value.status_code == 502 and "'final' is not allowed there" in refused.value.message
    _, _, proxy = constrained_front(serve, serve_app, vocab, "dynamo", ANSWER, None)
    with pytest.raises(openai.APIStatusError) as refused:
        client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, response_format=JSON_FORMAT)
    assert refused.value.status_code == 502 and "breaks the request's json_schema" in refused.value.message


@pytest.mark.parametrize(("flavor", "mode", "request_kwargs", "startup", "unenforced"), [
    ("dynamo", "xgrammar", REQUIRED, "no field for a xgrammar grammar", "a call to get_weather required"),
    ("trtllm", "none", {"response_format": JSON_FORMAT}, "are NOT sent", "final answer JSON (report)"),
    ("vllm", None, REQUIRED, "only the final answer's JSON Schema", "a call to get_weather required"),
    ("vllm", None, {**REQUIRED, "response_format": JSON_FORMAT}, "only the final answer's", "a required tool call"),
    ("sglang", "final-json", {"tools": [STRICT_WEATHER], "response_format": JSON_FORMAT}, "only the final answer's",
     "strict arguments for get_weather"),
])
def test_what_an_upstream_cannot_enforce_is_said_at_start_up_and_for_each_request(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
    caplog: pytest.LogCaptureFixture, flavor: str, mode: str | None, request_kwargs: dict[str, Any], startup: str,
    unenforced: str,
) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy.engine")
    completion = JSON_ANSWER if "response_format" in request_kwargs else CALL
    app, _, proxy = constrained_front(serve, serve_app, vocab, flavor, completion, mode)
    client = client_for(proxy)
    ids = [client.chat.completions.create(model=MODEL, messages=ASK, **request_kwargs).id for _ in range(2)]
    client.chat.completions.create(model=MODEL, messages=ASK)  # unconstrained: nothing to say
    engine_log = [r for r in caplog.records if r.name == "harmony_proxy.engine"]
    notices = [r for r in engine_log if r.levelno == logging.WARNING and startup in r.getMessage()]
    assert len(notices) == 1  # once, at start-up
    per_request = [r.getMessage() for r in engine_log if r.getMessage().startswith("request ")]
    assert len(per_request) == 2
    for request_id, message in zip(ids, per_request, strict=True):
        assert message.startswith(f"request {request_id}: the upstream ({flavor}, --upstream-guided-decoding")
        assert unenforced in message
    if flavor in ("dynamo", "trtllm"):
        assert not GUIDED_KEYS & set(app.state.seen[0])  # nothing half-sent that the server would refuse


def test_the_guided_decoding_option_reaches_the_engine(tmp_path: Any) -> None:
    from proxy.server.arguments import build_parser
    from proxy.server.startup import build_state

    def engine(*options: str) -> Any:
        args = build_parser().parse_args(["serve", "--upstream-url", "http://127.0.0.1:9/v1", "--no-store", *options])
        return build_state(args, "upstream").engine.inner

    assert engine().guided.mode == "final-json"
    assert engine("--upstream-flavor", "trtllm").guided.mode == "xgrammar"
    assert engine("--upstream-flavor", "sglang", "--upstream-guided-decoding", "llguidance").guided.mode == "llguidance"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream-guided-decoding", "outlines"])


def test_a_responses_text_format_travels_like_a_response_format(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    app, engine, proxy = constrained_front(serve, serve_app, vocab, "trtllm", JSON_ANSWER, None)
    text = {"format": {"type": "json_schema", "name": "report", "schema": REPORT, "strict": True}}
    response = client_for(proxy).responses.create(model=MODEL, input="Weather in Paris?", text=text, store=False)
    assert json.loads(response.output_text) == {"city": "Paris", "celsius": 18}
    grammar = engine.requests[-1].constraint.grammar
    assert grammar is not None and app.state.seen[-1]["response_format"] == grammar.structural_tag
