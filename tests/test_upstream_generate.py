"""The upstream engine and vLLM's token-only endpoint, against the fake vLLM (tests/fake_upstreams.py, whose
`/inference/v1/generate` tests/test_vllm_protocol.py compares with the real one's): found by itself, used with the
same sampling and constraints, and left for `/v1/completions` where a replica has it off or has none. The same
against the real vLLM: tests/test_vllm.py, tests/test_vllm_routing.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.engines.upstream.engine import UpstreamEngine
from proxy.engines.upstream.generate import ids_from_logprobs
from tests.conftest import MODEL, LiveServer
from tests.fake_upstreams import fake_upstream
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for, message_answer
from tests.waiting import eventually

ASK = [{"role": "user", "content": "Weather in Paris?"}]


def through(serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any, completion: str,
            token_endpoint: str | None, **options: Any) -> tuple[Any, LiveServer]:
    """A fake vLLM (its token-only endpoint `token_endpoint`: on, off or None) and harmony-proxy in front."""
    app = fake_upstream(vocab, "vllm", completion, token_endpoint=token_endpoint)
    upstream = serve_app(app)
    engine = UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, "vllm", **options)
    return app, serve(engine=engine)


def test_a_vllm_serving_it_gets_the_requests_there(serve: Callable[..., LiveServer],
                                                   serve_app: Callable[[Any], LiveServer], vocab: Any) -> None:
    app, proxy = through(serve, serve_app, vocab, ANSWER, "on")
    reply = client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, max_tokens=200, seed=4,
                                                       temperature=0.5)
    assert message_answer(reply)["content"] == "It is 18C." and reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens_details.cached_tokens == 64  # from the usage chunk, as on /v1/completions
    (body,) = app.state.seen
    assert "prompt" not in body and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["sampling_params"] == {"max_tokens": 200, "stop_token_ids": list(vocab.stop_token_ids), "seed": 4,
                                       "temperature": 0.5, "detokenize": False}
    assert body["token_ids"][-2:] == vocab.encode_harmony("<|start|>assistant") and "return_token_ids" not in body


def test_a_required_call_travels_in_sampling_params_from_the_first_token(
        serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any) -> None:
    """xgrammar mode: the whole completion's structural tag in `sampling_params.structured_outputs`, and
    `reasoning_ended` so vLLM applies it from the first token; final-json: the answer's schema, vLLM's own say."""
    app, proxy = through(serve, serve_app, vocab, CALL, "on", guided_decoding="xgrammar")
    reply = client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                       tool_choice="required")
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    body = app.state.seen[-1]
    assert json.loads(body["sampling_params"]["structured_outputs"]["structural_tag"])["type"] == "structural_tag"
    assert body["reasoning_ended"] is True
    app, proxy = through(serve, serve_app, vocab, '<|channel|>final<|message|>{"a":1}<|return|>', "on")
    client_for(proxy).chat.completions.create(model=MODEL, messages=ASK, response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}})
    body = app.state.seen[-1]
    assert body["sampling_params"]["structured_outputs"] == {"json": {"type": "object"}}
    assert "reasoning_ended" not in body


@pytest.mark.parametrize("token_endpoint", ["off", None])
def test_a_vllm_without_it_gets_completions_with_ids_in_logprobs(
        serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
        token_endpoint: str | None) -> None:
    """403 (vLLM without --enable-scale-out) or 404 (an older vLLM, another harmony-proxy): /v1/completions, the
    ids asked for in logprobs, never with `return_token_ids` (which would echo the prompt's)."""
    app, proxy = through(serve, serve_app, vocab, ANSWER, token_endpoint)
    reply = client_for(proxy).chat.completions.create(model=MODEL, messages=ASK)
    assert message_answer(reply)["content"] == "It is 18C."
    (body,) = app.state.seen
    assert "prompt" in body and body["logprobs"] == 0 and body["return_tokens_as_token_ids"] is True
    assert "return_token_ids" not in body
    assert proxy.engine._endpoints.known(0) is False


def test_a_replica_restarted_without_it_is_asked_again(serve: Callable[..., LiveServer],
                                                       serve_app: Callable[[Any], LiveServer], vocab: Any) -> None:
    """The request that meets the 403 fails (a bad gateway, as any refusal); the next one asks first, and goes to
    /v1/completions."""
    app, proxy = through(serve, serve_app, vocab, ANSWER, "on")
    client = client_for(proxy)
    client.chat.completions.create(model=MODEL, messages=ASK)
    app.state.token_endpoint = "off"
    failed = httpx.post(proxy.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=30)
    assert failed.status_code == 502 and "403" in failed.json()["error"]["message"]
    assert message_answer(client.chat.completions.create(model=MODEL, messages=ASK))["content"] == "It is 18C."
    assert "token_ids" in app.state.seen[0] and "prompt" in app.state.seen[-1]


def test_a_replica_not_ready_at_start_is_asked_by_the_first_request(
        serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any) -> None:
    """Asked at start-up, the replica answers 503 (not ready): not known. The first request asks again first, finds
    the endpoint, and goes there."""
    app = fake_upstream(vocab, "vllm", ANSWER, token_endpoint="loading")
    upstream = serve_app(app)
    engine = UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, "vllm")
    proxy = serve(engine=engine)
    eventually(lambda: app.state.probes >= 1, interval=0.05)  # the start-up probe
    assert engine._endpoints.known(0) is None
    app.state.token_endpoint = "on"
    client_for(proxy).chat.completions.create(model=MODEL, messages=ASK)
    assert engine._endpoints.known(0) is True and "token_ids" in app.state.seen[-1]


def test_ids_from_logprobs() -> None:
    assert ids_from_logprobs(["token_id:5", "token_id:200012"]) == [5, 200012] and ids_from_logprobs([]) == []
    for bad in (["5"], ["token_id:x"], ["token_id:"], ["id:5"]):
        with pytest.raises(ValueError):
            ids_from_logprobs(bad)
