"""Issue 33's seven gaps, each on the fake surface whose source it models (tests/fake_trtllm/_surface.py), and
KV-cache events reaching a router: two harmony-proxy + fake TensorRT-LLM replicas behind a harmony-proxy in
upstream mode, on a multi-turn workload, routed on the events each replica publishes, against round robin."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.engines.base import GenerationRequest, SamplingParams
from tests.test_e2e_chat import ANSWER
from tests.test_trtllm import events, model_folder, on_surface, trtllm_engine, wait_loaded
from tests.waiting import eventually, eventually_async

EVENTS_ON = {"kv_cache_config": {"enable_block_reuse": True, "event_buffer_max_size": 1024}}


@pytest.fixture
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from on_surface(getattr(request, "param", "1.4"), monkeypatch)


def built(folder: Path) -> bool:
    return any(e["event"] == "init" for e in events(folder))


def test_1_a_local_model_directory_is_served_under_its_folder_name(release: str, tmp_path: Path, vocab: Any) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    assert trtllm_engine(vocab, folder).prepare().served_model_name == "gpt-oss-fake"
    named = trtllm_engine(vocab, folder, "--served_model_name", "gpt-oss")
    assert named.prepare().served_model_name == "gpt-oss"


def test_2_grpc_on_the_newest_is_refused_before_the_model_loads(release: str, tmp_path: Path, vocab: Any) -> None:
    from proxy.engines.trtllm.serve import TrtllmServeError

    folder = model_folder(tmp_path, [ANSWER])
    with pytest.raises(TrtllmServeError, match="--grpc"):
        asyncio.run(trtllm_engine(vocab, folder, "--grpc").start())
    assert not built(folder)


def test_3_middleware_is_refused_before_the_model_loads(release: str, tmp_path: Path, vocab: Any) -> None:
    from proxy.engines.trtllm.serve import TrtllmServeError

    folder = model_folder(tmp_path, [ANSWER])
    with pytest.raises(TrtllmServeError, match="--middleware"):
        asyncio.run(trtllm_engine(vocab, folder, "--middleware", "starlette.middleware.gzip.GZipMiddleware").start())
    assert not built(folder)


def test_3_a_port_taken_before_trtllm_serve_binds_it_is_replaced(
    release: str, tmp_path: Path, vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.engines.trtllm import serve as trtllm_serve

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    free = trtllm_serve._loopback_port
    given = iter([["--host", "127.0.0.1", "--port", str(taken.getsockname()[1])]])
    monkeypatch.setattr(trtllm_serve, "_loopback_port", lambda: next(given, None) or free())
    folder = model_folder(tmp_path, [ANSWER])
    engine = trtllm_engine(vocab, folder)
    try:
        asyncio.run(engine.start())
        assert engine.ready and built(folder)
    finally:
        taken.close()
        asyncio.run(engine.close())


def test_3_an_llm_built_and_then_not_served_is_shut_down(
    release: str, tmp_path: Path, vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.engines.trtllm import engine as trtllm

    def broken(llm: Any) -> Any:
        raise ValueError("cannot read the engine")

    monkeypatch.setattr(trtllm, "context_window", broken)
    folder = model_folder(tmp_path, [ANSWER])
    with pytest.raises(ValueError, match="cannot read the engine"):
        asyncio.run(trtllm_engine(vocab, folder).start())
    assert [e["event"] for e in events(folder)] == ["init", "shutdown"]


@pytest.mark.parametrize("release", ["1.4+pr17787"], indirect=True)
def test_4_open_pr_17787_an_llm_the_server_builds_from_a_factory_is_served(
    release: str, tmp_path: Path, vocab: Any
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    engine = trtllm_engine(vocab, folder)
    asyncio.run(engine.start())
    assert engine.ready and events(folder, "init")[0]["instance"] == id(engine._llm)
    asyncio.run(engine.close())


@pytest.mark.parametrize("release", ["1.4+pr16939"], indirect=True)
def test_4_open_pr_16939_a_server_made_before_its_llm_is_refused_before_the_build(
    release: str, tmp_path: Path, vocab: Any
) -> None:
    from proxy.engines.trtllm.serve import TrtllmServeError

    folder = model_folder(tmp_path, [ANSWER])
    with pytest.raises(TrtllmServeError, match="without an LLM"):
        asyncio.run(trtllm_engine(vocab, folder).start())
    assert not built(folder)


@pytest.mark.parametrize("release", ["1.4+pr19379"], indirect=True)
def test_5_open_pr_19379_eight_front_ends_by_default_start_one_engine_for_ours(
    release: str, tmp_path: Path, vocab: Any
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    engine = trtllm_engine(vocab, folder)
    asyncio.run(engine.start())
    assert engine.ready
    assert events(folder, "init")[0]["args"]["num_serve_frontends"] == 1
    assert not events(folder, "spawn_frontends")  # trtllm-serve would re-run the command line 7 more times
    asyncio.run(engine.close())


def created(rank: int, event_id: int, window: int) -> dict[str, Any]:
    return {"event_id": event_id, "window_size": window, "attention_dp_rank": rank, "data": {"type": "created"}}


def stored(rank: int, event_id: int, window: int, blocks: list[list[int]], parent: int | None) -> dict[str, Any]:
    return {"event_id": event_id, "window_size": window, "attention_dp_rank": rank,
            "data": {"type": "stored", "parent_hash": parent, "blocks": [
                {"type": "stored_block", "block_hash": 100 * event_id + n,
                 "tokens": [{"type": "unique_token", "token_id": t} for t in block]}
                for n, block in enumerate(blocks)]}}


def test_6_events_are_read_per_rank_in_the_largest_window_and_a_partial_block_drops_only_itself() -> None:
    from proxy.engines.trtllm.kv_cache_events import KvCacheEvents

    reader = KvCacheEvents(llm=None, publish=lambda rank, events: None, block_size=4)
    for rank in (0, 1):
        for event_id, window in enumerate((128, 131072)):
            assert reader.read(created(rank, event_id, window)) == (rank, [])
    assert reader.window == 131072  # learned from the initial created events
    assert reader.read(stored(0, 2, 128, [[1, 2, 3, 4]], None)) == (0, [])  # the sliding window's
    # the ranks' event ids interleave: each rank has its own sequence, so nothing is cleared
    rank, read = reader.read(stored(1, 2, 131072, [[1, 2, 3, 4], [5, 6, 7, 8], [9]], None))
    assert rank == 1 and read == [{"type": "BlockStored", "block_hashes": [200, 201], "parent_block_hash": None,
                                   "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4,
                                   "kv_cache_spec_kind": "full_attention"}]
    assert reader.read(stored(0, 3, 131072, [[1, 2, 3, 4]], None))[1][0]["block_hashes"] == [300]
    assert reader.read(stored(0, 9, 131072, [[5, 6, 7, 8]], 300))[1][0] == {"type": "AllBlocksCleared"}  # a gap


def test_7_the_context_window_is_read_from_the_engine(release: str, tmp_path: Path, vocab: Any) -> None:
    folder = model_folder(tmp_path, [ANSWER], **{"config.json": json.dumps({"max_position_embeddings": 65536})})
    engine = trtllm_engine(vocab, folder, "--enable_chunked_prefill")
    asyncio.run(engine.start())
    assert engine._llm.args.max_seq_len is None  # as the PyTorch backend leaves it
    assert engine.context_window.total == engine.context_window.prompt == 65536
    asyncio.run(engine.close())


def test_7_a_reasoning_parser_does_not_reach_each_requests_sampling(
    release: str, tmp_path: Path, vocab: Any
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    engine = trtllm_engine(vocab, folder, "--reasoning_parser", "gpt_oss")

    async def one_request() -> None:
        await engine.start()
        steps = engine.generate(GenerationRequest("r", list(range(1, 40)), SamplingParams(4)))
        async for _ in steps:
            pass
        await engine.close()

    asyncio.run(one_request())
    assert events(folder, "generate")[0]["thinking_budget"] is False


def test_7_the_prompt_is_not_validated_again_to_convert_sampling(release: str) -> None:
    from tensorrt_llm.serve import openai_protocol

    from proxy.engines.trtllm.harmony import sampling_params

    prompts: list[int] = []

    class Recorded(openai_protocol.CompletionRequest):
        def __init__(self, **fields: Any) -> None:
            prompts.append(len(fields["prompt"]))
            super().__init__(**fields)

    protocol = type("Protocol", (), {"CompletionRequest": Recorded})
    request = GenerationRequest("r", list(range(100_000)), SamplingParams(4))
    params = sampling_params(protocol, request, "gpt-oss", None)
    assert params.max_tokens == 4 and prompts == [1]


def counters(base_url: str) -> tuple[float, float]:
    """A replica's own prompt tokens and prompt tokens its engine served from cache (its /metrics)."""
    found = {"vllm:prompt_tokens_total": 0.0, "vllm:prompt_tokens_cached_total": 0.0}
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rpartition(" ")[2])
    return found["vllm:prompt_tokens_total"], found["vllm:prompt_tokens_cached_total"]


def test_6_a_router_in_upstream_mode_routes_on_what_each_trtllm_replica_publishes(
    release: str, serve: Any, vocab: Any, tmp_path: Path
) -> None:
    """Two harmony-proxy + fake TensorRT-LLM replicas publishing KV-cache events; a harmony-proxy router in upstream
    mode, cache-aware, then round robin, on multi-turn conversations; the hit ratio from the replicas' counters."""
    from proxy.engines.upstream.engine import UpstreamEngine

    replicas = []
    for n in range(2):
        (tmp_path / f"r{n}").mkdir()
        engine = trtllm_engine(vocab, model_folder(tmp_path / f"r{n}", [ANSWER]), **EVENTS_ON)
        replica = serve(engine=engine, served_model_name="gpt-oss")
        wait_loaded(replica)
        sources = httpx.get(replica.base_url + "/kv_event_sources", timeout=5).json()
        assert sources["0"]["publisher"] == "zmq" and sources["0"]["endpoint"].startswith("tcp://*:")
        replicas.append(replica)
    urls = [replica.base_url + "/v1" for replica in replicas]

    def hit_ratio(routing: str, seed: int) -> float:
        router = UpstreamEngine(vocab, urls, "gpt-oss", routing=routing)
        proxy = serve(engine=router, served_model_name="gpt-oss")

        def serving() -> bool:
            return proxy.running() and all(replica.running() for replica in replicas)

        if routing == "cache-aware":
            eventually(lambda: all(s.publishers for s in router._subscribers), still=serving, interval=0.05)
            time.sleep(0.5)  # a SUB socket gets what is published once it has joined
        before = [counters(replica.base_url) for replica in replicas]
        conversations = [[] for _ in range(3)]  # odd: round robin moves each one
        for turn in range(3):
            for number, messages in enumerate(conversations):
                words = " ".join(f"c{seed}-{number}-t{turn}-w{w}" for w in range(60))
                messages.append({"role": "user", "content": words})
                response = httpx.post(proxy.base_url + "/v1/chat/completions", timeout=60, json={
                    "model": "gpt-oss", "messages": messages, "max_tokens": 8})
                assert response.status_code == 200, response.text
                messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
                if routing == "cache-aware":  # what the replica stored has been published and read back
                    eventually(lambda: sum(len(s.view) for s in router._subscribers) > 0, still=serving, interval=0.05)
        after = [counters(replica.base_url) for replica in replicas]
        prompt = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        cached = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
        return cached / prompt

    aware, round_robin = hit_ratio("cache-aware", 1), hit_ratio("round-robin", 2)
    print(f"prompt-cache hit ratio: cache-aware {aware:.3f}, round robin {round_robin:.3f}")
    assert aware > round_robin


def test_2_a_visual_generation_model_is_refused_before_it_loads(release: str, tmp_path: Path, vocab: Any) -> None:
    from proxy.engines.trtllm.serve import TrtllmServeError

    folder = model_folder(tmp_path, [ANSWER], **{"model_index.json": "{}"})
    with pytest.raises(TrtllmServeError, match="visual generation"):
        asyncio.run(trtllm_engine(vocab, folder).start())
    assert not built(folder)


def test_3_a_server_that_is_not_a_language_model_server_is_refused_and_what_it_was_given_shut_down() -> None:
    from proxy.engines.trtllm.serve import ServerReplaced, TrtllmServeError

    class Generator:
        closed = False

        def generate_async(self) -> None: ...

        def shutdown(self) -> None:
            self.closed = True

    generator = Generator()
    with pytest.raises(TrtllmServeError, match="MM_ENCODER"):
        ServerReplaced(generator=generator, server_role=type("Role", (), {"name": "MM_ENCODER"})())
    assert generator.closed


def test_6_each_attention_dp_rank_publishes_its_own_events(release: str, tmp_path: Path, vocab: Any) -> None:
    """With attention data parallelism each rank has its own cache and event ids: each gets its own publisher
    (as vLLM has per DP rank), its batches numbered on their own and marked with the rank; none clears the other."""
    import msgspec
    import zmq

    folder = model_folder(tmp_path, [ANSWER])
    engine = trtllm_engine(vocab, folder, "--tp_size", "2", "--enable_attention_dp", **EVENTS_ON)
    prompts = [list(range(1, 65)), list(range(100, 164))]  # dealt to rank 0, then rank 1

    async def scenario() -> dict[int, list[Any]]:
        await engine.start()
        sources = engine.kv_event_sources
        assert sources is not None and sorted(sources) == ["0", "1"]
        sockets = {}
        for rank, source in sources.items():
            sockets[int(rank)] = zmq.Context.instance().socket(zmq.SUB)
            sockets[int(rank)].setsockopt(zmq.SUBSCRIBE, b"")
            sockets[int(rank)].connect(source["endpoint"].replace("*", "127.0.0.1"))
        await asyncio.sleep(0.5)  # a SUB socket gets what is published once it has joined
        received: dict[int, list[Any]] = {0: [], 1: []}
        try:
            for prompt in prompts:
                steps = engine.generate(GenerationRequest("r", prompt, SamplingParams(2)))
                async for _ in steps:
                    pass
            for rank, subscriber in sockets.items():
                await eventually_async(lambda subscriber=subscriber: subscriber.poll(0), interval=0.05)
                while subscriber.poll(0):
                    _topic, sequence, payload = subscriber.recv_multipart()
                    received[rank].append((int.from_bytes(sequence, "big"), msgspec.msgpack.decode(payload)))
        finally:
            for subscriber in sockets.values():
                subscriber.close(linger=0)
            await engine.close()
        return received

    received = asyncio.run(scenario())
    for rank, prompt in enumerate(prompts):
        assert [sequence for sequence, _ in received[rank]] == [0]
        _ts, published, data_parallel_rank = received[rank][0][1]
        assert data_parallel_rank == rank
        assert [event["type"] for event in published] == ["BlockStored"]  # nothing cleared
        assert published[0]["token_ids"] == prompt


DECODE_AS_VLLM = """
import json, sys
import msgspec
from vllm.distributed.kv_events import KVEventBatch
batch = msgspec.msgpack.Decoder(KVEventBatch).decode(sys.stdin.buffer.read())
print(json.dumps({"rank": batch.data_parallel_rank, "events": [msgspec.to_builtins(event) for event in batch.events],
                  "kinds": [type(event).__name__ for event in batch.events]}))
"""


def test_6_a_published_batch_is_what_vllms_own_decoder_reads() -> None:
    """The batch goes out as vLLM's `ZmqEventPublisher` sends one, and vLLM's own `KVEventBatch` decodes it."""
    import subprocess

    import zmq

    from proxy.engines.trtllm.kv_event_publisher import KvEventPublisher
    from tests.vllm_server import vllm_python

    publisher = KvEventPublisher("127.0.0.1", rank=1)
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.connect(publisher.endpoint.replace("*", "127.0.0.1"))
    events = [{"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None, "token_ids": list(range(8)),
               "block_size": 4, "kv_cache_spec_kind": "full_attention"},
              {"type": "BlockRemoved", "block_hashes": [7]}, {"type": "AllBlocksCleared"}]
    try:
        while not subscriber.poll(50):  # a SUB socket gets what is published once it has joined: publish until then
            publisher.publish(events)
        frames = subscriber.recv_multipart()
    finally:
        subscriber.close(linger=0)
        publisher.close()
    assert frames[0] == b"" and len(frames[1]) == 8
    decoded = subprocess.run([str(vllm_python()), "-c", DECODE_AS_VLLM], input=frames[2], capture_output=True,
                             check=True, timeout=600)
    read = json.loads(decoded.stdout)
    assert read["rank"] == 1 and read["kinds"] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    stored = read["events"][0]
    assert (stored["block_hashes"], stored["token_ids"], stored["block_size"]) == ([7, 8], list(range(8)), 4)
    assert stored["kv_cache_spec_kind"] == "full_attention" and read["events"][1]["block_hashes"] == [7]
    assert (stored["lora_id"], stored["medium"], stored["lora_name"]) == (None, "GPU", None)  # required there
