"""One engine process serving front ends over a Unix socket (proxy/engines/host.py and remote.py).

The host runs the real TrtllmEngine on the fake TensorRT-LLM of tests/fake_trtllm, in its own process; the
front end is a RemoteEngine in the test (or in a process of its own, to kill it). The fake writes what it was
asked to events.jsonl in the model folder, which is how the tests see aborts and shutdowns in the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from parsers.vocab import Vocab
from proxy.engines import wire
from proxy.engines.base import (
    ContextWindow,
    EngineError,
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    Step,
    Usage,
)
from proxy.engines.remote import RemoteEngine, _Inbox
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER, CALL, client_for, message_answer
from tests.test_trtllm import ASK, events, model_folder, trtllm_engine
from tests.waiting import eventually, eventually_async
from tools.definitions import FunctionTool, ResponseFormat, ToolChoice

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fake_trtllm"
LONG = "<|channel|>final<|message|>" + " word" * 500 + "<|return|>"
STOPS = (200002, 200012)  # <|return|>, <|call|>
HOST = """
import functools, json, sys
from proxy.engines.host import run_engine_host
from proxy.engines.trtllm.engine import loaded_trtllm_engine
run_engine_host(functools.partial(loaded_trtllm_engine, json.loads(sys.argv[1])), sys.argv[2], log_level="info")
"""
FRONT_END = """
import asyncio, sys
from proxy.engines.base import GenerationRequest, SamplingParams
from proxy.engines.remote import RemoteEngine, _Inbox

async def main():
    engine = RemoteEngine(sys.argv[1], retry_interval=0.05)
    await engine.start()
    while not engine.ready:
        await asyncio.sleep(0.01)
    received = 0
    async for step in engine.generate(GenerationRequest("doomed", [1] * 21, SamplingParams(max_tokens=500))):
        received += 1
        if received == 3:
            print("streaming", flush=True)

asyncio.run(main())
"""
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE), str(REPO), os.environ.get("PYTHONPATH", "")])}


def request(prompt_length: int, max_tokens: int = 500, **sampling: Any) -> GenerationRequest:
    """Prompt lengths tell requests apart in the fake's events.jsonl."""
    return GenerationRequest(
        f"request-{prompt_length}", [1] * prompt_length, SamplingParams(max_tokens, stop_token_ids=STOPS, **sampling)
    )


def aborted(folder: Path, prompt_length: int) -> bool:
    recorded = events(folder)
    ids = {e["request_id"] for e in recorded if e["event"] == "generate" and e["prompt_length"] == prompt_length}
    return any(e["event"] == "abort" and e["request_id"] in ids for e in recorded)


def alive(host: subprocess.Popen[bytes] | multiprocessing.process.BaseProcess) -> Callable[[], bool]:
    """What a wait on the engine host holds to: its process runs."""
    if isinstance(host, subprocess.Popen):
        return lambda: host.poll() is None
    return host.is_alive


@contextlib.asynccontextmanager
async def remote(socket_path: Path, host_alive: Callable[[], bool]) -> AsyncIterator[RemoteEngine]:
    """A front end connected to the host at `socket_path`, waited for as long as `host_alive()`."""
    engine = RemoteEngine(socket_path, retry_interval=0.05)
    await engine.start()
    try:
        await eventually_async(lambda: engine.ready, still=host_alive, why="the host ended before it was connected")
        yield engine
    finally:
        await engine.close()


async def collect(steps: AsyncGenerator[Step, None]) -> list[Step]:
    return [step async for step in steps]


def start_host_process(
    folder: Path, socket_path: Path, stderr: int | None = None, **llm: Any,
) -> subprocess.Popen[bytes]:
    arguments = json.dumps([str(folder), *(part for key, value in llm.items() for part in (f"--{key}", str(value)))])
    return subprocess.Popen([sys.executable, "-c", HOST, arguments, str(socket_path)], env=CHILD_ENV, stderr=stderr)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def socket_path() -> Iterator[Path]:
    folder = tempfile.mkdtemp(prefix="engine-host-")  # short: a Unix socket path has at most 107 bytes
    yield Path(folder) / "engine.sock"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def start_host(socket_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    hosts: list[subprocess.Popen[bytes]] = []

    def start(folder: Path, **llm: Any) -> subprocess.Popen[bytes]:
        hosts.append(start_host_process(folder, socket_path, **llm))
        return hosts[-1]

    yield start
    for host in hosts:
        stop(host)


class SharedHost(NamedTuple):
    folder: Path
    path: Path  # its socket
    alive: Callable[[], bool]


@pytest.fixture(scope="module")
def shared_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedHost]:
    """A host streaming LONG at 10 ms a step, for the tests that only need a running host."""
    folder = model_folder(tmp_path_factory.mktemp("shared"), [LONG], step_seconds="0.01")
    sockets = tempfile.mkdtemp(prefix="engine-host-")
    path = Path(sockets) / "engine.sock"
    host = start_host_process(folder, path)
    yield SharedHost(folder, path, alive(host))
    stop(host)
    shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture
def fake_in_this_process() -> Iterator[None]:
    sys.path.insert(0, str(FAKE))
    yield
    sys.path.remove(str(FAKE))
    for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def test_a_remote_engine_streams_what_the_engine_streams_in_process(
    start_host: Callable[..., Any], socket_path: Path, vocab: Vocab, tmp_path: Path, fake_in_this_process: None
) -> None:

    folder = model_folder(tmp_path, [ANSWER, CALL])
    weather = FunctionTool("get_weather", "The weather.",
                           {"type": "object", "properties": {"city": {"type": "string"}}})
    constraint = OutputConstraint((weather,), ToolChoice("function", "get_weather"),
                                  ResponseFormat("a", {"type": "object"}))
    requests = [
        GenerationRequest("a", list(range(1, 71)), SamplingParams(300, 0.5, 0.8, 7, STOPS, min_tokens=2), constraint),
        GenerationRequest("b", list(range(1, 80)), SamplingParams(300, stop_token_ids=STOPS)),  # 64 cached tokens
        GenerationRequest("c", [5, 6, 7], SamplingParams(4, stop_token_ids=STOPS)),  # cut off: length
    ]
    host = start_host(folder, max_batch_size=64)

    async def remotely() -> list[list[Step]]:
        async with remote(socket_path, alive(host)) as engine:
            return [await collect(engine.generate(r)) for r in requests]

    async def in_process() -> list[list[Step]]:
        engine = trtllm_engine(vocab, folder, stream_interval=3)
        await engine.start()
        try:
            return [await collect(engine.generate(r)) for r in requests]
        finally:
            await engine.close()

    streamed, local = asyncio.run(remotely()), asyncio.run(in_process())
    # The same tokens and ending; steps that reached the front end together may have been handed on as one.
    assert [_tokens(steps) for steps in streamed] == [_tokens(steps) for steps in local]
    assert [(s[-1].finish_reason, s[-1].usage) for s in streamed] == [(s[-1].finish_reason, s[-1].usage) for s in local]
    assert [steps[-1].finish_reason for steps in streamed] == ["stop", "stop", "length"]
    assert streamed[1][-1].usage == Usage(79, len(vocab.encode_harmony(CALL)), 64)
    assert max(len(step.token_ids) for step in local[0]) == 3
    sampling = [e["sampling"] for e in events(folder) if e["event"] == "generate"]
    assert sampling[:3] == sampling[3:] and sampling[0]["seed"] == 7 and sampling[0]["min_tokens"] == 2


def _tokens(steps: list[Step]) -> list[int]:
    return [token for step in steps for token in step.token_ids]


def test_steps_waiting_in_the_inbox_are_handed_on_as_one() -> None:
    """A front end that fell behind the host sends what arrived meanwhile in one step (one frame), not many."""
    class Link:  # what generate() uses of a connection to the host
        alive = True

        def __init__(self, items: list[Any]) -> None:
            self.inbox = _Inbox()
            for item in items:
                self.inbox.put(item)

        def submit(self, request: GenerationRequest) -> tuple[int, _Inbox]:
            return 1, self.inbox

        def cancel(self, handle: int) -> None:
            raise AssertionError("a finished request is not cancelled")

    async def received(items: list[Any]) -> list[Step]:
        engine = RemoteEngine(Path("/nowhere"), "trtllm")
        engine._link = Link(items)  # type: ignore[assignment]
        return await collect(engine.generate(GenerationRequest("a", [1], SamplingParams(10))))

    usage = Usage(1, 5)
    assert asyncio.run(received([Step([1]), Step([2, 3]), Step([4]), Step([5], "stop", usage)])) == [
        Step([1, 2, 3, 4, 5], "stop", usage)
    ]
    failure = EngineError("boom", 500)
    with pytest.raises(EngineError, match="boom"):
        asyncio.run(received([Step([1]), Step([2]), failure]))


def test_closing_the_stream_aborts_the_request_in_the_engine(shared_host: SharedHost) -> None:
    folder, path, host_alive = shared_host

    async def scenario() -> None:
        async with remote(path, host_alive) as engine:
            steps = engine.generate(request(11))
            for _ in range(3):
                await anext(steps)
            await steps.aclose()
            await eventually_async(lambda: aborted(folder, 11), still=host_alive, why="the host ended")
            after = await collect(engine.generate(request(12, max_tokens=5)))  # the connection still serves
            assert after[-1].finish_reason == "length" and after[-1].usage == Usage(12, 5, 0)
            assert not aborted(folder, 12)

    asyncio.run(scenario())


def test_a_front_end_that_dies_has_its_requests_aborted(shared_host: SharedHost) -> None:
    folder, path, host_alive = shared_host
    front_end = subprocess.Popen([sys.executable, "-c", FRONT_END, str(path)], stdout=subprocess.PIPE, env=CHILD_ENV)

    async def scenario() -> None:
        async with remote(path, host_alive) as engine:
            assert await asyncio.to_thread(front_end.stdout.readline) == b"streaming\n"  # type: ignore[union-attr]
            survivor = engine.generate(request(22, max_tokens=60))
            await anext(survivor)
            front_end.send_signal(signal.SIGKILL)
            await asyncio.to_thread(front_end.wait)
            await eventually_async(lambda: aborted(folder, 21), still=host_alive, why="the host ended")
            rest = await collect(survivor)  # another front end's request goes on
            assert rest[-1].finish_reason == "length" and rest[-1].usage == Usage(22, 60, 0)
            assert not aborted(folder, 22)

    try:
        asyncio.run(scenario())
    finally:
        stop(front_end)


def test_many_streams_are_multiplexed_on_one_connection(shared_host: SharedHost, vocab: Vocab) -> None:
    _, path, host_alive = shared_host
    arrivals: list[tuple[int, bool]] = []

    async def stream(engine: RemoteEngine, number: int) -> list[Step]:
        steps = []
        async for step in engine.generate(request(30, max_tokens=20)):
            arrivals.append((number, step.finish_reason is not None))
            steps.append(step)
        return steps

    async def scenario() -> list[list[Step]]:
        async with remote(path, host_alive) as engine:
            await engine.check_health()  # a round trip to the host's engine.check_health()
            return await asyncio.gather(*(stream(engine, number) for number in range(100)))

    expected = vocab.encode_harmony(LONG)[:20]
    for steps in asyncio.run(scenario()):
        assert [token for step in steps for token in step.token_ids] == expected
        assert steps[-1].finish_reason == "length" and steps[-1].usage == Usage(30, 20, 0)
    first_finished = next(index for index, (_, last) in enumerate(arrivals) if last)
    assert {number for number, _ in arrivals[:first_finished]} == set(range(100))  # all ran at once


def test_not_ready_until_the_host_has_loaded_the_model(
    start_host: Callable[..., Any], socket_path: Path, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER], load_seconds="1.0")
    host = start_host(folder)

    async def scenario() -> None:
        engine = RemoteEngine(socket_path, retry_interval=0.05)
        await engine.start()
        # The app's lifespan must not wait for the model: started before the host has loaded it (the control: the
        # host's start-up, then its 1 s load).
        assert not any(e["event"] == "init" for e in events(folder))
        assert not engine.ready
        with pytest.raises(EngineError) as unhealthy:
            await engine.check_health()
        with pytest.raises(EngineError) as refused:
            await anext(engine.generate(request(3)))
        assert (unhealthy.value.status, refused.value.status) == (503, 503)
        assert not socket_path.exists()  # nothing to connect to while the model loads
        await eventually_async(lambda: engine.ready, still=alive(host), why="the host ended while loading")
        assert any(e["event"] == "init" for e in events(folder))
        await engine.check_health()
        steps = await collect(engine.generate(request(3)))
        assert steps[-1].finish_reason == "stop"
        await engine.close()
        assert not engine.ready

    asyncio.run(scenario())


def test_sigterm_while_the_model_loads_ends_the_host_at_once(
    start_host: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER], load_seconds="30")
    host = start_host(folder, stderr=subprocess.PIPE)
    assert host.stderr is not None
    while b"loading" not in (line := host.stderr.readline()):  # the LLM is being built
        assert line, "the host ended before loading the model"
    host.terminate()
    assert host.wait() == 128 + signal.SIGTERM  # unwound by SystemExit, so atexit clean-up ran
    assert events(folder) == []  # the LLM never finished loading: the host ended before the 30 s load did


def test_engine_errors_cross_with_their_status_and_code(
    start_host: Callable[..., Any], socket_path: Path, vocab: Vocab, tmp_path: Path, fake_in_this_process: None
) -> None:

    folder = model_folder(tmp_path, [ANSWER], fail_after="5")
    host = start_host(folder, max_num_tokens=16)

    async def outcomes(engine: Any) -> list[tuple[int, int, str | None, str]]:
        results = []
        for prompt_length in (20, 3):  # too long for max_num_tokens; fails after 5 tokens
            received = 0
            with pytest.raises(EngineError) as failed:
                async for step in engine.generate(request(prompt_length)):
                    received += len(step.token_ids)
            results.append((received, failed.value.status, failed.value.code, failed.value.message))
        return results

    async def remotely() -> list[tuple[int, int, str | None, str]]:
        async with remote(socket_path, alive(host)) as engine:
            return await outcomes(engine)

    async def in_process() -> list[tuple[int, int, str | None, str]]:
        engine = trtllm_engine(vocab, folder, "--max_num_tokens", "16")
        await engine.start()
        try:
            return await outcomes(engine)
        finally:
            await engine.close()

    crossed = asyncio.run(remotely())
    assert crossed == asyncio.run(in_process())
    (_, status, code, message), (received, failing, failing_code, failure) = crossed
    assert (status, code) == (400, "context_length_exceeded") and "takes at most 16" in message
    assert (received, failing, failing_code) == (5, 500, "engine_error") and "CUDA out of memory" in failure


def test_a_host_that_dies_fails_running_requests_and_a_new_one_is_reconnected(
    start_host: Callable[..., Any], socket_path: Path, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [LONG], step_seconds="0.01")
    host = start_host(folder)

    async def scenario() -> None:
        async with remote(socket_path, alive(host)) as engine:
            steps = engine.generate(request(3))
            await anext(steps)
            host.kill()
            with pytest.raises(EngineError) as gone:
                await collect(steps)
            assert (gone.value.status, gone.value.code) == (503, "engine_unavailable")
            assert not engine.ready
            with pytest.raises(EngineError):
                await engine.check_health()
            again = start_host(folder)  # at the same path, where the dead host's socket file is left
            await eventually_async(lambda: engine.ready, still=alive(again), why="the new host ended")
            steps_again = await collect(engine.generate(request(3, max_tokens=5)))
            assert steps_again[-1].usage == Usage(3, 5, 0)

    asyncio.run(scenario())


def test_sigterm_fails_running_requests_and_shuts_the_engine_down(
    socket_path: Path, tmp_path: Path, fake_in_this_process: None
) -> None:
    from proxy.engines.host import run_engine_host
    from proxy.engines.trtllm.engine import loaded_trtllm_engine

    folder = model_folder(tmp_path, [LONG], step_seconds="0.01")
    build = functools.partial(loaded_trtllm_engine, [str(folder)])
    host = multiprocessing.get_context("spawn").Process(target=run_engine_host, args=(build, socket_path))
    host.start()  # as a supervisor would start it

    async def scenario() -> None:
        async with remote(socket_path, alive(host)) as engine:
            steps = engine.generate(request(3))
            await anext(steps)
            host.terminate()
            with pytest.raises(EngineError) as closing:
                await collect(steps)
            assert (closing.value.status, closing.value.code) == (503, "engine_shutting_down")

    try:
        asyncio.run(scenario())
        host.join()
        assert host.exitcode == 0
        assert [e["event"] for e in events(folder)][-2:] == ["abort", "shutdown"]
        assert not socket_path.exists()
    finally:
        if host.is_alive():
            host.kill()


def test_an_http_front_end_on_the_engine_host(
    serve: Callable[..., LiveServer], start_host: Callable[..., Any], socket_path: Path, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, [ANSWER, LONG], step_seconds="0.01")
    server = serve(engine=RemoteEngine(socket_path, retry_interval=0.05))
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 503
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=5).status_code == 503
    host = start_host(folder)
    eventually(lambda: httpx.get(server.base_url + "/health", timeout=5).status_code == 200, still=alive(host),
               interval=0.02, why="the host ended")
    answer = message_answer(client_for(server).chat.completions.create(model=MODEL, messages=ASK["messages"]))
    assert answer == {"reasoning": "Easy.", "content": "It is 18C.", "tool_calls": [], "finish_reason": "stop"}
    body = {**ASK, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=30) as streamed:
        lines = streamed.iter_lines()
        for _ in range(6):
            next(lines)
    # The client left: aborted in the host.
    eventually(lambda: any(e["event"] == "abort" for e in events(folder)), still=alive(host), interval=0.02,
               why="the host ended")


def test_a_front_end_advertises_what_the_hosts_engine_takes(
    serve: Callable[..., LiveServer], start_host: Callable[..., Any], socket_path: Path, tmp_path: Path
) -> None:
    """With --workers the engine is built in the host: its greeting says what the built LLM takes (max_num_tokens
    without chunked prefill), and each front end advertises that in /v1/models and the Codex catalog."""
    server = serve(engine=RemoteEngine(socket_path, retry_interval=0.05))
    host = start_host(model_folder(tmp_path, [ANSWER]), max_num_tokens=64)

    def advertised() -> dict[str, Any] | None:
        models = httpx.get(server.base_url + "/v1/models", params={"client_version": "0.171.0"}, timeout=5).json()
        return models if models["data"][0]["max_model_len"] == 64 else None

    models = eventually(advertised, still=alive(host), interval=0.05, why="the host ended")
    assert models["models"][0]["context_window"] == 64


def test_the_greeting_carries_the_context_window() -> None:
    window = ContextWindow(total=131072, prompt=8192)
    frame = wire.hello_frame("trtllm", window)
    assert wire.read_hello(frame[wire.HEADER.size:]) == ("trtllm", window, None)
    assert wire.read_hello(wire.hello_frame("mock")[wire.HEADER.size:]) == ("mock", None, None)
    sources = {"0": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}}
    assert wire.read_hello(wire.hello_frame("trtllm", window, sources)[wire.HEADER.size:]).kv_event_sources == sources
    for bad in (b'{"engine": "x", "context_window": [0, 1], "kv_event_sources": null}',
                b'{"engine": 1, "context_window": null, "kv_event_sources": null}',
                b'{"engine": "x", "context_window": null, "kv_event_sources": []}', b"[]"):
        with pytest.raises(wire.ProtocolError):
            wire.read_hello(bytes([wire.VERSION]) + bad)


def test_a_front_end_names_where_the_hosts_engine_publishes_its_kv_cache_events(
    serve: Callable[..., LiveServer], start_host: Callable[..., Any], socket_path: Path, tmp_path: Path
) -> None:
    """With --workers the engine host publishes the KV-cache events (ZMQ, as vLLM); its greeting says where, and each
    front end lists that at /kv_event_sources, as one replica: a router subscribes there."""
    import msgspec
    import zmq

    folder = model_folder(tmp_path, [ANSWER])
    options = folder / "events.yaml"
    options.write_text("kv_cache_config: {enable_block_reuse: true, event_buffer_max_size: 1024}\n")
    server = serve(engine=RemoteEngine(socket_path, retry_interval=0.05))
    host = start_host(folder, extra_llm_api_options=options)

    def listing() -> httpx.Response | None:
        listed = httpx.get(server.base_url + "/kv_event_sources", timeout=5)
        return listed if listed.status_code == 200 else None

    listed = eventually(listing, still=alive(host), interval=0.05, why="the host ended")
    endpoint = listed.json()["0"]["endpoint"]
    assert endpoint.startswith("tcp://*:") and listed.json()["0"]["publisher"] == "zmq"
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.connect(endpoint.replace("*", "127.0.0.1"))
    try:
        time.sleep(0.5)  # a SUB socket gets what is published once it has joined
        body = {"model": MODEL, "prompt": list(range(1, 65)), "max_tokens": 2}
        assert httpx.post(server.base_url + "/v1/completions", json=body, timeout=30).status_code == 200
        eventually(lambda: subscriber.poll(100), still=alive(host), interval=0, why="the host ended")
        _topic, sequence, payload = subscriber.recv_multipart()
        _timestamp, published, rank = msgspec.msgpack.decode(payload)
        assert int.from_bytes(sequence, "big") == 0  # the publisher's first batch
        assert rank == 0 and published[0]["type"] == "BlockStored"
        assert published[0]["token_ids"] == list(range(1, 65)) and published[0]["block_size"] == 32
    finally:
        subscriber.close(linger=0)


def _host_rss_kib(process: subprocess.Popen[bytes]) -> int:
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError("VmRSS")


def _greeted(socket_path: Path) -> Any:
    """A raw connection to the host, its greeting read."""
    import socket as sockets

    connection = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    connection.connect(str(socket_path))
    length, _, kind = wire.HEADER.unpack(connection.recv(wire.HEADER.size, sockets.MSG_WAITALL))
    connection.recv(length, sockets.MSG_WAITALL)
    assert kind == wire.HELLO
    return connection


def test_a_front_end_cannot_make_the_host_buffer_more_than_a_request(
    start_host: Callable[..., Any], socket_path: Path, tmp_path: Path
) -> None:
    """A frame announcing 1 GiB, then 200 MiB of it: before, the host buffered all it was sent (up to 1 GiB a
    connection); now the header alone closes the connection. A frame within the limit, half sent, then the
    connection closed: what it buffered is freed at once (before, a reference cycle through the frame reader kept
    it until the collector's next full pass). Before: +211 MiB, and 50 MiB kept; now nothing, and 11 MiB."""
    host = start_host(model_folder(tmp_path, [LONG]))

    async def ready() -> None:
        async with remote(socket_path, alive(host)):
            pass

    asyncio.run(ready())
    chunk = b"\0" * (1 << 20)
    before = _host_rss_kib(host)
    connection = _greeted(socket_path)
    connection.sendall(wire.HEADER.pack(1 << 30, 1, wire.SUBMIT))
    sent = 0
    with contextlib.suppress(OSError):  # the host closes the connection
        while sent < 200 << 20:
            connection.sendall(chunk)
            sent += len(chunk)
    time.sleep(0.5)
    buffered = _host_rss_kib(host) - before
    connection.close()

    before = _host_rss_kib(host)
    connection = _greeted(socket_path)
    connection.sendall(wire.HEADER.pack(60 << 20, 1, wire.SUBMIT) + chunk * 50)
    # Until the host has read most of it.
    eventually(lambda: _host_rss_kib(host) - before >= 40 << 10, still=alive(host), interval=0.05,
               why="the host ended")
    connection.close()
    time.sleep(0.5)
    kept = _host_rss_kib(host) - before
    print(f"\n1 GiB announced, {sent >> 20} MiB sent: the host grew {buffered >> 10} MiB; 50 MiB of a frame, then "
          f"closed: {kept >> 10} MiB kept")
    assert sent < 200 << 20 and buffered < 16 << 10  # the connection was closed at the header
    assert kept < 25 << 10  # under half of it: freed (before: all 50 MiB kept); the rest is the allocator's
    assert host.poll() is None


def test_the_host_refuses_token_ids_past_the_vocabulary_and_absurd_max_tokens(
    shared_host: SharedHost, vocab: Vocab
) -> None:
    folder, path, host_alive = shared_host

    async def refusals() -> list[EngineError]:
        refused = []
        async with remote(path, host_alive) as engine:
            for prompt, max_tokens in [([1] * 40 + [vocab.vocab_size], 5), ([1] * 41, 10**12)]:
                with pytest.raises(EngineError) as failed:
                    await collect(engine.generate(GenerationRequest(
                        f"refused-{len(prompt)}", prompt, SamplingParams(max_tokens, stop_token_ids=STOPS))))
                refused.append(failed.value)
            after = await collect(engine.generate(request(42, max_tokens=5)))  # the connection still serves
            assert after[-1].finish_reason == "length"
        return refused

    token, tokens = asyncio.run(refusals())
    assert (token.status, token.code) == (400, "invalid_token_id") and str(vocab.vocab_size) in token.message
    assert (tokens.status, tokens.code) == (400, "context_length_exceeded") and "max_tokens" in tokens.message
    lengths = {event["prompt_length"] for event in events(folder) if event["event"] == "generate"}
    assert 41 not in lengths and 42 in lengths  # the refused never reached the engine
