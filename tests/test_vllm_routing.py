"""Routing on what real vLLM replicas hold: their own KV-cache events, read as vLLM publishes them.

Two real replicas (the session's vLLM and one more, tests/vllm_server.py), both publishing KV-cache events on a ZMQ
port (`--kv-events-config`, found by harmony-proxy through `/kv_event_sources`), behind harmony-proxy's upstream
engine. The block view the router builds from the events must match what vLLM's own prefix-cache counters say.
The second replica runs `--tokens-only` (vLLM's token-only endpoint alone, no tokenizer), the session's
`--enable-scale-out`: harmony-proxy finds `/inference/v1/generate` on both and sends its requests there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from parsers.vocab import Vocab
from proxy.engines.upstream.engine import UpstreamEngine
from proxy.engines.upstream.kv_events import chained_keys
from tests.conftest import LiveServer
from tests.engines import Recording
from tests.vllm_server import VllmServer, free_port, kv_event_flags, start_vllm
from tests.waiting import eventually

HITS = "vllm:prefix_cache_hits_total"


@pytest.fixture(scope="module")
def replicas(vllm: VllmServer, tiny_gpt_oss: Path, tmp_path_factory: pytest.TempPathFactory,
             ) -> Iterator[list[VllmServer]]:
    """A second replica (first in the list), `--tokens-only`, with vLLM's development endpoints (POST
    /reset_prefix_cache)."""
    log = tmp_path_factory.mktemp("vllm-replica") / "vllm.log"
    previous = os.environ.get("VLLM_SERVER_DEV_MODE")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    try:
        server = start_vllm(tiny_gpt_oss, ("--tokens-only", *kv_event_flags(free_port())), log_path=log)
        second = server.__enter__()
    finally:
        if previous is None:
            os.environ.pop("VLLM_SERVER_DEV_MODE")
        else:
            os.environ["VLLM_SERVER_DEV_MODE"] = previous
    try:
        yield [second, vllm]
    finally:
        server.__exit__(None, None, None)


def running(*servers: VllmServer) -> bool:
    """True while every replica's process runs; a failure with its log's tail once one has exited."""
    for server in servers:
        assert server.process is not None and server.process.poll() is None, server.log_tail()
    return True


def following(*subscribers: Any) -> bool:
    """Whether each KV-event subscriber (proxy/engines/upstream/kv_subscriber.py) still runs: one that gave up on
    its replica's events would never see what the test waits for."""
    return all(subscriber._task is not None and not subscriber._task.done() for subscriber in subscribers)


def chat(proxy: LiveServer, model: str, messages: list[dict[str, str]]) -> str:
    response = httpx.post(proxy.base_url + "/v1/chat/completions", timeout=120,
                          json={"model": model, "messages": messages, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"].get("content") or ""


def test_the_router_sees_what_each_real_replica_holds(replicas: list[VllmServer], vocab: Vocab, serve) -> None:
    engine = UpstreamEngine(vocab, [replica.base_url for replica in replicas], replicas[0].model)
    recording = Recording(engine)
    proxy = serve(engine=recording, served_model_name=replicas[0].model)
    subscribers = engine._subscribers
    # Each wait lasts as long as the replicas run and the subscribers follow them (pytest-timeout catches a hang).
    live = lambda: running(*replicas) and following(*subscribers)
    eventually(lambda: all(subscriber.publishers is not None for subscriber in subscribers), still=live, interval=0.1)
    eventually(lambda: bool(engine._endpoints.known(0) and engine._endpoints.known(1)), still=live,
               interval=0.1)  # both serve the token-only endpoint
    time.sleep(1.0)  # ZMQ delivers only what is published after a subscription joins
    held = [subscriber.view for subscriber in subscribers]
    # Each view is bounded by what its replica's cache holds, as vLLM's own /metrics says (num_gpu_blocks).
    for replica, subscriber in zip(replicas, subscribers, strict=True):
        info = next(family for family in text_string_to_metric_families(httpx.get(replica.url + "/metrics").text)
                    if family.name == "vllm:cache_config_info").samples[0].labels
        assert subscriber.view.ranks[0].capacity_tokens == int(info["num_gpu_blocks"]) * int(info["block_size"])

    user = " ".join(f"w{n}" for n in range(700))  # ~1,400 tokens: several of vLLM's 128-token blocks
    messages = [{"role": "user", "content": user}]
    answer = chat(proxy, replicas[0].model, messages)
    prompt = recording.requests[-1].prompt_token_ids
    eventually(lambda: held[0].block_size is not None, still=live, interval=0.1)
    size = held[0].block_size
    whole = len(prompt) // size * size
    # Both replicas are idle and equally loaded: the first takes it. Its events say it holds the whole prompt, in
    # full blocks; the other holds none of it.
    eventually(lambda: held[0].matched_tokens(chained_keys(prompt, size)) >= whole, still=live, interval=0.1)
    assert held[1].matched_tokens(chained_keys(prompt, size)) == 0

    # The next turn goes where its prefix is, and vLLM's own counter shows it reused what the events said.
    hits_before = replicas[0].metrics().get(HITS, 0.0)
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
    chat(proxy, replicas[0].model, messages)
    assert len(recording.requests) == 2
    assert replicas[0].metrics().get(HITS, 0.0) - hits_before >= whole - size

    # The replica drops its cache. vLLM publishes AllBlocksCleared with its next step's events (an idle engine
    # publishes nothing): after one more request the router no longer believes it holds the conversation.
    httpx.post(replicas[0].url + "/reset_prefix_cache", timeout=30).raise_for_status()
    httpx.post(replicas[0].url + "/inference/v1/generate", timeout=120, json={
        "model": replicas[0].model, "token_ids": list(range(1000, 1300)),
        "sampling_params": {"max_tokens": 1}}).raise_for_status()
    eventually(lambda: held[0].matched_tokens(chained_keys(prompt, size)) == 0, still=live, interval=0.1)
    assert held[0].matched_tokens(chained_keys(list(range(1000, 1300)), size)) == 2 * size


def test_a_replica_publishing_nothing_is_routed_on_what_was_sent(vllm: VllmServer, vocab: Vocab, serve) -> None:
    """The session's vLLM with events, and a harmony-proxy URL that answers 404 to /kv_event_sources."""
    mock = serve()
    engine = UpstreamEngine(vocab, [vllm.base_url, mock.base_url + "/v1"], vllm.model)
    serve(engine=engine, served_model_name=vllm.model)
    eventually(lambda: engine._subscribers[0].publishers is not None,
               still=lambda: running(vllm) and following(engine._subscribers[0]), interval=0.1)
    eventually(lambda: engine._subscribers[1]._task.done(), interval=0.1)  # it asked once, and was told 404
    assert engine._subscribers[1].publishers is None
    eventually(lambda: None not in (engine._endpoints.known(0), engine._endpoints.known(1)),
               still=lambda: running(vllm), interval=0.1)
    assert engine._endpoints.known(0) is True and engine._endpoints.known(1) is False  # harmony-proxy: 404
    assert json.loads(httpx.get(vllm.url + "/kv_event_sources", timeout=10).text)["0"]["enable_kv_cache_events"]
