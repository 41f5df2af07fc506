"""The TensorRT-LLM engine on each release NVIDIA's gpt-oss guides name, as trtllm-serve behaves there.

The fake trtllm-serve (tests/fake_trtllm, `_surface.py`) mirrors gpt-oss-dev, 1.0, 1.1, 1.2, 1.3.0rc19+ and 1.4;
each test runs on all six. TensorRT-LLM itself needs a GPU: these check harmony-proxy against the real classes'
rules, not the kernels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.engines.base import GenerationRequest, SamplingParams
from proxy.engines.upstream.routing import CacheAwareRouter
from tests.conftest import LiveServer
from tests.test_e2e_chat import ANSWER
from tests.test_trtllm import ASK, events, model_folder, on_surface, trtllm_engine, trtllm_server

RELEASES = ("gpt-oss-dev", "1.0", "1.1", "1.2", "1.3", "1.4")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "trtllm"


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from on_surface(request.param, monkeypatch)


def last_generate(folder: Path) -> dict[str, Any]:
    return events(folder, "generate")[-1]


def test_requests_are_sampled_as_that_releases_trtllm_serve_converts_them(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder)
    assert httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "seed": 7}, timeout=30).status_code == 200
    generate = last_generate(folder)
    assert {k: generate["sampling"][k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 1.0, "top_p": 1.0, "top_k": 0}  # openai_protocol's to_sampling_params
    # 1.0's TorchSampler argmaxes everything without enable_mixed_sampler, as under trtllm-serve (its YAML sets it)
    assert generate["decoding"] == ("greedy" if release in ("gpt-oss-dev", "1.0") else "sampling")
    assert generate["seed_used"] == (7 if release == "1.4" else None)  # per-request seeds from PR #17172
    httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "temperature": 0}, timeout=30)
    assert last_generate(folder)["decoding"] == "greedy"  # asked for


def test_cached_tokens_are_the_engines_own(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str
) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]))
    usages = [httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
              for _ in range(2)]
    if release in ("gpt-oss-dev", "1.0", "1.1"):  # no RequestOutput.cached_tokens before PR #7637: unknown, not 0
        assert all("prompt_tokens_details" not in usage for usage in usages)
    else:
        assert 0 < usages[1]["prompt_tokens_details"]["cached_tokens"] <= usages[1]["prompt_tokens"]


DOCS_YAMLS = {  # each docs YAML, and the releases it is for
    "low_latency.yaml": ("1.1", "1.2", "1.3", "1.4"),
    "max_throughput.yaml": ("1.1", "1.2", "1.3", "1.4"),
    "hopper_low_latency.yaml": ("1.1", "1.2", "1.3", "1.4"),
    "1.0/low_latency.yaml": ("gpt-oss-dev", "1.0"),
    "1.0/max_throughput.yaml": ("gpt-oss-dev", "1.0"),
    # 1.0/hopper_low_latency.yaml (TRITON) is for the gpt-oss-dev container, whose MoeConfig was not in the index
    # to read; the 1.0-era class has no TRITON (id 1520735490), and the fake follows that.
    "1.3/hopper_low_latency.yaml": ("1.3", "1.4"),
}


@pytest.mark.parametrize(("name", "release"), [(name, release) for name, releases in DOCS_YAMLS.items()
                                               for release in releases], indirect=["release"])
def test_each_docs_yaml_loads_on_the_releases_it_is_for(vocab: Any, tmp_path: Path, release: str, name: str) -> None:
    engine = trtllm_engine(vocab, model_folder(tmp_path, [ANSWER]), "--extra_llm_api_options", str(DOCS / name))
    asyncio.run(engine.start())
    assert engine.call.llm_args["guided_decoding_backend"] == "llguidance"
    asyncio.run(engine.close())


def test_the_router_follows_the_kv_cache_events_the_engine_publishes(vocab: Any, tmp_path: Path, release: str) -> None:
    """Where the YAML turns the events on, the engine publishes them as vLLM does (ZMQ, msgpack batches), and a
    router subscribed to them learns what the engine stores and evicts."""
    import zmq
    import zmq.asyncio

    from proxy.engines.upstream.kv_events import HeldBlocks, ReplicaBlocks
    from proxy.engines.upstream.kv_subscriber import EventSubscriber

    folder = model_folder(tmp_path, [ANSWER], cache_blocks="4")  # the engine holds 4 blocks of 32 tokens
    events_on = {"kv_cache_config": {"enable_block_reuse": True, "event_buffer_max_size": 1024}}
    engine = trtllm_engine(vocab, folder, **events_on)
    conversation, other = list(range(1, 129)), list(range(1000, 1128))

    async def scenario() -> None:
        await engine.start()
        sources = engine.kv_event_sources
        assert sources is not None and list(sources) == ["0"] and sources["0"]["publisher"] == "zmq"
        held = HeldBlocks()
        router = CacheAwareRouter(2, held=[None, held])
        subscriber = EventSubscriber("http://127.0.0.1:1", ReplicaBlocks(), client=None)  # type: ignore[arg-type]
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(sources["0"]["endpoint"].replace("*", "127.0.0.1"))

        async def receive() -> None:
            while True:
                await subscriber.take(await socket.recv_multipart(), held)

        receiving = asyncio.create_task(receive())
        await asyncio.sleep(0.5)  # a SUB socket gets what is published once it has joined
        try:
            for prompt in (conversation, other):  # the second evicts the first (4 blocks held)
                steps = engine.generate(GenerationRequest("r", prompt, SamplingParams(2)))
                await anext(steps)
                await steps.aclose()
                if prompt is conversation:
                    await until(lambda: router.route(conversation).matched_blocks[1] == 2)  # 128 tokens: 2 blocks
                    assert router.route(conversation).order[0] == 1
            await until(lambda: router.route(conversation).matched_blocks[1] == 0)  # removed by the engine
            assert router.route(other).matched_blocks[1] == 2
        finally:
            receiving.cancel()
            socket.close(linger=0)
            await engine.close()

    asyncio.run(scenario())


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the router did not follow the engine's events")


def test_no_kv_cache_events_unless_the_arguments_turn_them_on(vocab: Any, tmp_path: Path, release: str) -> None:
    engine = trtllm_engine(vocab, model_folder(tmp_path, [ANSWER]))
    asyncio.run(engine.start())
    assert engine.kv_events is None  # event_buffer_max_size is 0 by default
    asyncio.run(engine.close())
