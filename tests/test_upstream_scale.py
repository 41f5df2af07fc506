"""The upstream path has no hidden cap: many streams at once all reach the upstream, none waits in a pool.

The upstream here holds every stream open until all of them have arrived, then answers them all: a front end that
let only some through at once (httpx's default pool took 100) would never see an answer. Reading the stream is
`proxy/engines/upstream/http.py`; its corner cases (a refusal's body, a body that ends with its connection, a slow
consumer, an idle connection the upstream closed) are checked against real servers below.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.engines.upstream.engine import UpstreamEngine
from proxy.engines.upstream.http import (
    FIRST_READ,
    HIGH_WATER,
    STEP_BYTES,
    ConnectionPool,
    Origin,
    StreamEnded,
    UpstreamHTTPError,
)
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER

STREAMS = 400
STALL_SECONDS = 60  # no new stream reached the upstream for this long: it never will (a hang detector, not a timing)


class Gate:
    """An upstream's `/v1/completions` that answers only once `expected` requests are open at the same time."""

    def __init__(self, vocab: Any, expected: int) -> None:
        self.expected = expected
        self.arrived = 0
        self.lock = threading.Lock()
        self.tokens = vocab.encode_harmony(ANSWER)
        self._open: asyncio.Event | None = None

    async def completions(self, request: Request) -> Response:
        await request.json()
        if self._open is None:
            self._open = asyncio.Event()
        with self.lock:
            self.arrived += 1
            if self.arrived >= self.expected:
                self._open.set()
        await self._open.wait()
        return StreamingResponse(self._events(), media_type="text/event-stream")

    async def _events(self) -> Any:
        for index, token in enumerate(self.tokens):
            last = index == len(self.tokens) - 1
            chunk = {"choices": [{"index": 0, "text": "", "token_ids": [token],
                                  "finish_reason": "stop" if last else None, "stop_reason": None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        return Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                 Route("/v1/models", models)])


async def stream_all(url: str, count: int, gate: Gate) -> list[str]:
    """`count` streamed chats at once; each one's text. Fails if the upstream stops seeing new streams."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # no cap on this side either
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None)) as client:

        async def chat() -> str:
            body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Weather?"}]}
            text = []
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            text.append(choice["delta"].get("content") or "")
            return "".join(text)

        tasks = [asyncio.ensure_future(chat()) for _ in range(count)]
        seen, since = 0, time.monotonic()
        while not all(task.done() for task in tasks):
            await asyncio.wait(tasks, timeout=0.5)
            if gate.arrived != seen:
                seen, since = gate.arrived, time.monotonic()
            elif gate.arrived < count and time.monotonic() - since > STALL_SECONDS:
                for task in tasks:
                    task.cancel()
                pytest.fail(f"only {gate.arrived} of {count} streams reached the upstream at once")
        return [task.result() for task in tasks]


def test_400_upstream_streams_all_start_at_once(serve: Callable[..., LiveServer], vocab: Any,
                                                request: pytest.FixtureRequest) -> None:
    gate = Gate(vocab, STREAMS)
    upstream = LiveServer(gate.app(), timeout_keep_alive=3600).start()  # idle connections stay open for the reuse
    request.addfinalizer(upstream.stop)
    engine = UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, max_in_flight=STREAMS)
    proxy = serve(engine=engine)
    texts = asyncio.run(stream_all(proxy.base_url, STREAMS, gate))
    assert gate.arrived == STREAMS
    assert texts == ["It is 18C."] * STREAMS
    assert engine.pool is not None and engine.pool.opened == STREAMS  # one connection each, opened as needed
    # Finished streams leave their connections for the next requests: a second round opens none.
    gate.arrived, gate._open = 0, None
    gate.expected = 10
    assert asyncio.run(stream_all(proxy.base_url, 10, gate)) == ["It is 18C."] * 10
    assert engine.pool.opened == STREAMS


# The HTTP client's corner cases, against real servers on loopback.

async def _lines(pool: ConnectionPool, url: str) -> tuple[int, bytes]:
    connection = await pool.post(Origin(url), "/go", b"{}")
    if connection.status != 200:
        return connection.status, await connection.read_body()
    got = b""
    try:
        while True:
            got += await connection.next_lines()
    except StreamEnded:
        pass
    connection.finish()
    return connection.status, got


def raw_server(serve_app: Callable[[Any], LiveServer], answer: Callable[[Request], Response]) -> str:
    async def go(request: Request) -> Response:
        return answer(request)

    return serve_app(Starlette(routes=[Route("/v1/go", go, methods=["POST"])])).base_url + "/v1"


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_the_client_reads_lines_however_the_body_is_framed(serve_app: Callable[[Any], LiveServer],
                                                           chunked: bool) -> None:
    text = b"data: 1\r\n\r\ndata: 2\n\ndata: 3"  # CRLF lines, and a last line with no newline

    def answer(request: Request) -> Response:
        if chunked:
            async def body() -> Any:
                for index in range(0, len(text), 4):
                    yield text[index:index + 4]
            return StreamingResponse(body(), media_type="text/event-stream")
        return Response(text, media_type="text/event-stream")

    url = raw_server(serve_app, answer)

    async def run() -> tuple[int, bytes]:
        pool = ConnectionPool(5, 30)
        try:
            return await _lines(pool, url)
        finally:
            pool.close()

    assert asyncio.run(run()) == (200, text + b"\n")


def test_a_refusal_body_is_read_and_the_connection_not_reused(serve_app: Callable[[Any], LiveServer]) -> None:
    url = raw_server(serve_app, lambda request: JSONResponse({"error": {"message": "no"}}, status_code=400))

    async def run() -> tuple[tuple[int, bytes], tuple[int, bytes], int]:
        pool = ConnectionPool(5, 30)
        try:
            return await _lines(pool, url), await _lines(pool, url), pool.opened
        finally:
            pool.close()

    first, second, opened = asyncio.run(run())
    assert first == second == (400, b'{"error":{"message":"no"}}')
    assert opened == 2


def test_a_connection_the_upstream_closed_while_idle_is_replaced(serve_app: Callable[[Any], LiveServer]) -> None:
    async def go(request: Request) -> Response:
        return Response(b"data: x\n\n")

    server = serve_app(Starlette(routes=[Route("/v1/go", go, methods=["POST"])]))

    async def run() -> tuple[list[tuple[int, bytes]], int]:
        pool = ConnectionPool(5, 30)
        try:
            first = await _lines(pool, server.base_url + "/v1")
            (idle,) = [connection for kept in pool._idle.values() for connection in kept]
            for protocol in list(server._server.server_state.connections):  # the upstream closes its end
                protocol.loop.call_soon_threadsafe(protocol.transport.close)
            while idle.reusable():
                await asyncio.sleep(0)
            return [first, await _lines(pool, server.base_url + "/v1")], pool.opened
        finally:
            pool.close()

    assert asyncio.run(run()) == ([(200, b"data: x\n\n")] * 2, 2)


def test_a_dead_port_and_a_silent_upstream_are_named(serve_app: Callable[[Any], LiveServer]) -> None:
    from tests.test_upstream import dead_url

    async def silent(request: Request) -> Response:
        await asyncio.sleep(3600)
        return Response(b"")

    url = serve_app(Starlette(routes=[Route("/v1/go", silent, methods=["POST"])])).base_url + "/v1"

    async def run() -> list[str]:
        pool = ConnectionPool(5, 0.2)
        problems = []
        for target in (dead_url(), url):
            try:
                await _lines(pool, target)
            except UpstreamHTTPError as exc:
                problems.append(str(exc))
        pool.close()
        return problems

    assert asyncio.run(run()) == ["connection failed", "no data before the read timeout"]


def test_a_busy_event_loop_is_not_taken_for_an_upstream_that_does_not_answer(
        serve_app: Callable[[Any], LiveServer]) -> None:
    """Thousands of requests arriving at once keep the loop busy past the connect timeout: the connection the
    upstream accepted meanwhile is used, not reported as timed out."""
    url = raw_server(serve_app, lambda request: Response(b"data: x\n\n"))

    async def run() -> tuple[int, bytes]:
        pool = ConnectionPool(0.2, 30)
        try:
            reading = asyncio.ensure_future(_lines(pool, url))
            await asyncio.sleep(0)  # the connection is under way
            time.sleep(0.6)  # noqa: ASYNC251 (the point: the loop does other work for three connect timeouts)
            return await reading
        finally:
            pool.close()

    assert asyncio.run(run()) == (200, b"data: x\n\n")


def test_the_pool_is_sized_from_admission(serve_app: Callable[[Any], LiveServer]) -> None:
    from proxy.server.arguments import build_parser
    from proxy.server.startup import build_state

    def limits(*options: str) -> tuple[int, int | None]:
        args = build_parser().parse_args(["serve", "--upstream-url", "http://127.0.0.1:9/v1", "--no-store", *options])
        engine = build_state(args, "upstream").engine
        return engine.queue.max_concurrent, engine.inner.max_in_flight

    assert limits() == (1024, 1024)
    assert limits("--max-concurrent-requests", "300") == (300, 300)
    assert limits("--max-concurrent-requests", "0")[1] is None  # no admission limit: none here either

    # Idle connections kept per replica: at most max_idle; the rest close, and the next burst opens what it lacks.
    url = raw_server(serve_app, lambda request: Response(b"data: x\n\n"))

    async def run() -> list[int]:
        pool = ConnectionPool(5, 30, max_idle=2)
        opened = []
        try:
            for _ in range(2):
                await asyncio.gather(*(_lines(pool, url) for _ in range(5)))
                opened.append(pool.opened)
        finally:
            pool.close()
        return opened

    assert asyncio.run(run()) == [5, 8]


# Flow control and fairness: a step at most STEP_BYTES a turn, at most HIGH_WATER bytes read ahead.

def _event_lines(count: int, size: int = 100) -> list[bytes]:
    """`count` SSE events of `size` bytes each, numbered (a line out of place shows)."""
    return [b"data: %0*d\n\n" % (size - 8, index) for index in range(count)]


def test_a_reader_that_takes_nothing_stops_reading_with_at_most_high_water_held(
        serve_app: Callable[[Any], LiveServer]) -> None:
    """An upstream far ahead of its reader (4 MB sent, nothing taken): reading stops with FIRST_READ held, then
    with HIGH_WATER held once a step was taken; TCP holds the rest. Everything comes whole, a step at a time."""
    events = _event_lines(40_000)

    async def body() -> Any:
        for index in range(0, len(events), 100):
            yield b"".join(events[index:index + 100])

    url = raw_server(serve_app, lambda request: StreamingResponse(body(), media_type="text/event-stream"))

    async def run() -> tuple[list[int], list[int], bytes]:
        pool = ConnectionPool(5, 30)
        held, steps, got = [], [], b""
        try:
            connection = await pool.post(Origin(url), "/go", b"{}")
            for _ in range(2):
                while not connection.paused:  # the reader takes nothing: reading must stop
                    await asyncio.sleep(0.01)
                held.append(connection.buffered)
                lines = await connection.next_lines()
                steps.append(len(lines))
                got += lines
            while True:
                try:
                    lines = await connection.next_lines()
                except StreamEnded:
                    break
                steps.append(len(lines))
                got += lines
                held.append(connection.buffered)
            connection.finish()
            return held, steps, got
        finally:
            pool.close()

    held, steps, got = asyncio.run(run())
    assert held[0] <= FIRST_READ and max(held) <= HIGH_WATER
    assert max(steps) <= STEP_BYTES
    assert got == b"".join(events)


def test_streams_with_lines_waiting_step_in_turn(serve_app: Callable[[Any], LiveServer]) -> None:
    """Two answers read whole before their readers start: each reader takes a step of at most STEP_BYTES and lets
    the other take one before its next, as the engine in process steps each request once a turn."""
    events = b"".join(_event_lines(30))  # 3,000 bytes: within the first read, more than two steps
    assert STEP_BYTES * 2 < len(events) <= FIRST_READ
    url = raw_server(serve_app, lambda request: Response(events, media_type="text/event-stream"))

    async def run() -> tuple[list[tuple[str, int]], list[bytes]]:
        pool = ConnectionPool(5, 30)
        order: list[tuple[str, int]] = []
        try:
            connections = [await pool.post(Origin(url), "/go", b"{}") for _ in range(2)]
            for connection in connections:
                while not connection.complete:
                    await asyncio.sleep(0.01)

            async def read(name: str, connection: Any) -> bytes:
                got = b""
                while True:
                    try:
                        lines = await connection.next_lines()
                    except StreamEnded:
                        return got
                    order.append((name, len(lines)))
                    got += lines

            texts = await asyncio.gather(read("a", connections[0]), read("b", connections[1]))
            return order, texts
        finally:
            pool.close()

    order, texts = asyncio.run(run())
    assert texts == [events, events]
    assert all(size <= STEP_BYTES for _, size in order)
    assert [name for name, _ in order] == ["a", "b"] * (len(order) // 2)


def test_an_answer_left_unread_does_not_stall_its_connection_s_next(serve_app: Callable[[Any], LiveServer]) -> None:
    """An answer that came whole while reading was stopped (its reader took nothing, a stop string say) leaves its
    connection for the next request, which is read."""
    body = b"".join(_event_lines(FIRST_READ // 128, 128))
    assert len(body) == FIRST_READ  # reading stops as the last byte comes in
    url = raw_server(serve_app, lambda request: Response(body, media_type="text/event-stream"))

    async def run() -> tuple[tuple[int, bytes], bool, int]:
        pool = ConnectionPool(5, 30)
        try:
            connection = await pool.post(Origin(url), "/go", b"{}")
            while not connection.complete:
                await asyncio.sleep(0.01)
            paused = connection.paused
            connection.finish()  # whole: kept for the next request
            return await _lines(pool, url), paused, pool.opened
        finally:
            pool.close()

    second, paused, opened = asyncio.run(run())
    assert paused and opened == 1
    assert second == (200, body)


def test_a_refusal_longer_than_a_read_ahead_is_read(serve_app: Callable[[Any], LiveServer]) -> None:
    """Reading stopped at the first read's bound before anyone asked for the refusal's body: it is read whole."""
    message = "x" * (2 * HIGH_WATER)
    url = raw_server(serve_app, lambda request: JSONResponse({"error": {"message": message}}, status_code=400))

    async def run() -> tuple[int, bytes]:
        pool = ConnectionPool(5, 30)
        try:
            connection = await pool.post(Origin(url), "/go", b"{}")
            while not connection.paused:
                await asyncio.sleep(0.01)
            return connection.status, await connection.read_body()
        finally:
            pool.close()

    status, body = asyncio.run(run())
    assert status == 400 and json.loads(body) == {"error": {"message": message}}


def test_a_finished_answer_leaves_its_connection_before_the_last_step_is_handed_on(
        serve_app: Callable[[Any], LiveServer], vocab: Any) -> None:
    """The request after a finished one (a client that asks again the moment it has its answer) finds the
    connection idle: it was released when the answer was whole, not when the reader closed the stream."""
    from proxy.engines.base import GenerationRequest, SamplingParams

    gate = Gate(vocab, 1)
    upstream = serve_app(gate.app())
    engine = UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, kv_events=False, token_endpoint=False)

    async def run() -> list[tuple[bool, int]]:
        await engine.start()
        assert engine.pool is not None
        seen = []
        try:
            for _ in range(2):
                gate.arrived, gate._open = 0, None
                steps = engine.generate(GenerationRequest("r", vocab.encode_harmony(ANSWER)[:5], SamplingParams(100)))
                async for step in steps:
                    if step.finish_reason is not None:
                        seen.append((sum(map(len, engine.pool._idle.values())) == 1, engine.pool.opened))
                await steps.aclose()
        finally:
            await engine.close()
        return seen

    assert asyncio.run(run()) == [(True, 1), (True, 1)]
