"""The upstream's token stream over HTTP/1.1: one keep-alive connection per request in flight, the response parsed
by httptools straight from each read, its SSE `data:` lines handed on a bounded step a turn of the event loop.

Why not httpx here: in front of a fast upstream (`benchmarks/load_bench.py --upstream`, cProfile), httpx, httpcore
and h11 took about half of the front end's CPU per token: a pure-Python HTTP state machine, an anyio stream and
several generators per network read. httptools is uvicorn's own parser (llhttp, in C; already a dependency), and an
asyncio protocol over uvloop wakes the reader once per read whatever it brought. aiohttp's client parses with
llhttp too, but it is not a dependency, and still goes through a stream reader and an iterator per read. Measured
by `benchmarks/upstream_client_bench.py` (64 streams of vLLM-shaped chunks, client CPU per event, with the same
SSE and msgspec decoding behind aiohttp; one event per write / 8 / 64): this client 3.7 / 1.6 / 2.5 us, aiohttp
6.1 / 2.7 / 3.3 us, httpx 25.4 / 17.4 / 16.8 us.

No hidden limits: a request never waits for a connection. It takes an idle one to its replica or opens one; how
many are in flight is bounded by admission (`--max-concurrent-requests`), which also bounds the idle connections
kept per replica (`max_idle`).

Flow control, and fairness between streams: the reader is handed a step of at most `STEP_BYTES` (whole lines) at a
time, one per turn of the event loop, as an engine in process hands on one step per stream per turn. Taking all
that had come in one step let a fast upstream that ran ahead of a saturated front end make every turn work through
every stream's backlog before a new request's first token. A stream holds at most `HIGH_WATER` bytes read and not
yet taken: a read brings no more than the room left (`asyncio.BufferedProtocol`), reading stops when it is full and
starts again once the reader has taken it down to `LOW_WATER`, and TCP holds the rest, slowing the upstream to what
is delivered. Only a line longer than that (vLLM echoing a prompt's ids) grows past it, up to `MAX_LINE`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 16 << 10  # a stream's bytes read and not yet taken: reading stops when it holds this many
LOW_WATER = 8 << 10  # ... and starts again once the reader has taken it down to this
STEP_BYTES = 1 << 10  # the most one step takes (whole lines; a longer line whole): ~4 vLLM chunks
FIRST_READ = 4 << 10  # ... until the reader has taken its first step: the head and a few lines, soon handed on
LONG_LINE_READ = 64 << 10  # what a read may bring while a line longer than HIGH_WATER comes in
MAX_LINE = 64 << 20  # one SSE line (vLLM echoes a whole prompt's ids in one)
ERROR_BODY = 1 << 16  # what is kept of a refusal's body
LOOP_LAG = 0.1  # seconds late a timer may run before we take it for a busy event loop, not a slow upstream


class UpstreamHTTPError(Exception):
    """The connection failed; the message says how, in words a client may read (no URL, no credentials)."""


class StreamEnded(Exception):
    """Raised by `next_lines` once the response has ended and every line has been taken."""


class Origin:
    """Where a base URL's requests go: scheme, host, port, the path prefix and the Host header."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an upstream URL must be http:// or https://host..., not {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.path = parts.path.rstrip("/")
        default = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if default else f"{name}:{self.port}"


class ConnectionPool:
    """Connections to the upstreams, kept alive between requests; `post` sends a request and returns its response
    once the status line and headers have come."""

    def __init__(self, connect_timeout: float, read_timeout: float, headers: Mapping[str, str] | None = None,
                 max_idle: int | None = None) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self._headers = _header_lines(headers or {})
        self._idle: dict[tuple[str, int, bool], list[UpstreamConnection]] = {}
        self._ssl: ssl.SSLContext | None = None
        # Every connection reads into this, one read at a time (the bytes are parsed before the next read).
        self.reads = memoryview(bytearray(max(HIGH_WATER, LONG_LINE_READ)))
        self.opened = 0  # connections opened so far (tests read it)

    async def post(self, origin: Origin, path: str, body: bytes,
                   headers: Mapping[str, str] | None = None) -> UpstreamConnection:
        """POST `body` (JSON) to `origin` + `path`; the connection that carries it, its head read."""
        head = (f"POST {origin.path}{path} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(body)}\r\n"
                f"{self._headers}{_header_lines(headers or {})}\r\n").encode("latin-1")
        key = (origin.host, origin.port, origin.tls)
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.reusable():
                # A connection the server closed while idle fails before any byte of an answer: try a new one.
                try:
                    return await _sent(connection, head + body, key)
                except UpstreamHTTPError:
                    if connection.answered:
                        raise
        return await _sent(await self._open(origin), head + body, key)

    async def _open(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        connection = UpstreamConnection(self)
        tls = None
        if origin.tls:
            tls = self._ssl = self._ssl or ssl.create_default_context()
        attempt = asyncio.ensure_future(loop.create_connection(lambda: connection, origin.host, origin.port, ssl=tls))
        expired = False

        def expire(deadline: float) -> None:
            nonlocal expired
            if attempt.done():
                return
            if loop.time() - deadline > LOOP_LAG:
                # This timer ran late: our own event loop was busy (thousands of requests arriving at once), and a
                # connection the upstream accepted meanwhile may not have been seen yet. That is no slow upstream:
                # wait on, while the loop catches up.
                loop.call_at(loop.time() + LOOP_LAG, expire, loop.time() + LOOP_LAG)
                return
            expired = True
            attempt.cancel()

        timer = loop.call_at(loop.time() + self.connect_timeout, expire, loop.time() + self.connect_timeout)
        try:
            await attempt
        except asyncio.CancelledError:
            if not expired:
                raise
            raise UpstreamHTTPError("connection timed out") from None
        except OSError:
            raise UpstreamHTTPError("connection failed") from None
        finally:
            timer.cancel()
            if not attempt.done():
                attempt.cancel()  # we were cancelled: the attempt goes with us
        self.opened += 1
        return connection

    def release(self, connection: UpstreamConnection, key: tuple[str, int, bool]) -> None:
        idle = self._idle.setdefault(key, [])
        if self.max_idle is not None and len(idle) >= self.max_idle:
            connection.close()
        else:
            idle.append(connection)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


async def _sent(connection: UpstreamConnection, request: bytes, key: tuple[str, int, bool]) -> UpstreamConnection:
    try:
        return await connection.send(request, key)
    except BaseException:
        connection.close()  # cancelled or failed before the head: the connection is not left behind
        raise


class UpstreamConnection(asyncio.BufferedProtocol):
    """One keep-alive connection, one request at a time. Each read (at most the room left under `HIGH_WATER`) feeds
    httptools; the body's bytes gather in one buffer, and the reader (`next_lines`) takes the complete lines there, a
    step of at most `STEP_BYTES` a turn."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._key: tuple[str, int, bool] | None = None
        self._buffer = bytearray()
        self._scanned = 0  # how far the buffer is known to hold no newline
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self._paused = False
        self._high = FIRST_READ  # reading stops when the buffer holds this much: HIGH_WATER once a step was taken
        self._turn_owed = False  # the last step left complete lines: the loop turns before the next
        self._failure: UpstreamHTTPError | None = None
        self._lost = False
        self.status = 0
        self.answered = False  # a byte of the answer arrived
        self.complete = False  # the whole answer arrived
        self.keep_alive = False
        self._framed = False  # the body has a length or chunks; else it ends with the connection

    # The request

    async def send(self, request: bytes, key: tuple[str, int, bool]) -> UpstreamConnection:
        self._key = key
        self.status, self.answered, self.complete, self._framed = 0, False, False, False
        self._buffer.clear()
        self._scanned = 0
        self._turn_owed = False
        self._high = FIRST_READ
        self._parser = httptools.HttpResponseParser(self)
        assert self._transport is not None
        if self._paused:  # the last answer came whole, its reader stopped before taking it all: read this one
            self._resume()
        self._transport.write(request)
        self._last_data = self._loop.time()
        self._timer = self._loop.call_later(self._pool.read_timeout, self._check_idle)
        while not self.status:
            await self._wait()
        return self

    async def next_lines(self, limit: int = STEP_BYTES) -> bytes:
        """The complete lines of the body not taken yet, ending in a newline: at least one, at most `limit` bytes of
        them (a longer line whole; 0: no limit). StreamEnded once the answer is over, UpstreamHTTPError if the
        connection fails first. Where the last call left complete lines, this one lets the event loop turn first: a
        stream steps once a turn, like every other."""
        if self._turn_owed:
            self._turn_owed = False
            await asyncio.sleep(0)
        buffer = self._buffer
        while True:
            if limit and len(buffer) > limit:
                end = buffer.rfind(b"\n", 0, limit)
                if end < 0:  # the first line is longer than a step
                    end = buffer.find(b"\n", max(limit, self._scanned))
            else:
                end = buffer.rfind(b"\n", self._scanned)
            if end >= 0:
                lines = bytes(buffer[: end + 1])
                del buffer[: end + 1]
                self._scanned = 0
                self._turn_owed = buffer.find(b"\n") >= 0
                self._high = HIGH_WATER
                if self._paused and len(buffer) <= LOW_WATER:
                    self._resume()
                return lines
            self._scanned = len(buffer)
            if self.complete:
                if self._buffer:  # a last line with no newline
                    lines = bytes(self._buffer) + b"\n"
                    self._buffer.clear()
                    return lines
                raise StreamEnded
            if len(self._buffer) > MAX_LINE:
                self.close()
                raise UpstreamHTTPError("an event too large")
            if self._paused:
                self._resume()  # no complete line yet: the rest of it must come in
            await self._wait()

    async def read_body(self) -> bytes:
        """The rest of the answer (a refusal's), at most ERROR_BODY bytes of it; the connection is closed after."""
        self._high = ERROR_BODY
        try:
            while not self.complete and len(self._buffer) < ERROR_BODY:
                if self._paused:
                    self._resume()
                await self._wait()
        finally:
            self.close()
        return bytes(self._buffer[:ERROR_BODY])

    def finish(self) -> None:
        """The reader is done: a finished answer leaves the connection to the next request; an unfinished one
        closes it, which is how the upstream learns to abort the request."""
        self._cancel_timer()
        if self.complete and self.keep_alive and not self._lost and self._failure is None and self._key:
            self._pool.release(self, self._key)
        else:
            self.close()

    @property
    def paused(self) -> bool:
        """Reading is stopped: the buffer is full (HIGH_WATER, FIRST_READ before the first step)."""
        return self._paused

    @property
    def buffered(self) -> int:
        """Bytes of the body read and not yet taken."""
        return len(self._buffer)

    def reusable(self) -> bool:
        return not self._lost and self._failure is None and self._transport is not None \
            and not self._transport.is_closing()

    def close(self) -> None:
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    async def _wait(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._lost:
            raise UpstreamHTTPError("the connection broke")
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._failure is not None:
            raise self._failure

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check_idle(self) -> None:
        """The read timeout, one timer per request: re-armed for what is left when data came meanwhile."""
        idle = self._loop.time() - self._last_data
        if idle < self._pool.read_timeout:
            self._timer = self._loop.call_later(self._pool.read_timeout - idle, self._check_idle)
            return
        self._timer = None
        self._fail(UpstreamHTTPError("no data before the read timeout"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, failure: UpstreamHTTPError) -> None:
        if self._failure is None:
            self._failure = failure
        self.close()
        self._wake()

    def _resume(self) -> None:
        self._paused = False
        if self._transport is not None:
            self._transport.resume_reading()

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: as much as the room left under HIGH_WATER (none left: a line longer than that
        is coming in, which `next_lines` reads on for)."""
        room = self._high - len(self._buffer)
        return self._pool.reads[: room if room > 0 else LONG_LINE_READ]

    def buffer_updated(self, nbytes: int) -> None:
        self._last_data = self._loop.time()
        self.answered = True
        try:
            self._parser.feed_data(self._pool.reads[:nbytes])
        except httptools.HttpParserError:
            self._fail(UpstreamHTTPError("the upstream sent an answer that is not HTTP"))
            return
        if len(self._buffer) >= self._high and not self._paused and self._transport is not None:
            self._paused = True  # full: TCP holds the rest until the reader has taken some
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self.status and not self._framed:
            self.complete, self.keep_alive = True, False  # a body without length or chunks ends here
        self._cancel_timer()
        self._wake()

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._buffer += body

    def on_message_complete(self) -> None:
        self.complete = True


def _header_lines(headers: Mapping[str, str]) -> str:
    lines = []
    for name, value in headers.items():
        if any(char in name + value for char in "\r\n\0"):
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)
