"""A closed-loop HTTP/1.1 + SSE load client, cheap enough to drive a one-core server from one core.

`run_load(...)` starts C clients on the running event loop (uvloop in load_bench.py). Each client holds one
keep-alive connection and sends the same pre-built POST back to back; the response is parsed by an
`asyncio.Protocol` straight from `data_received` (no stream reader, no coroutine switch per read): the status
line and headers, chunked transfer coding, and SSE frames split on blank lines. Per frame it only counts;
the first frame carrying content or reasoning text gives TTFT, later frames give inter-frame gaps, and the
frame before `data: [DONE]` (the usage chunk, `stream_options.include_usage`) gives the tokens: tokens in the
window are its frames times the tokens per frame of the streams of the run that ended (of the request sent
alone, when none did). Frames read in
one `data_received` share one timestamp, so a gap of 0 means they arrived together.

One request is sent alone first (it checks the answer; its usage is the fallback for tokens per frame); then the C
clients start and, after `warmup` seconds, the window opens for `duration` seconds; then every connection is
aborted. Frames, gaps, completions, 429s (rejected; the client pauses `retry_pause` and sends again) and errors are
counted in the window; TTFT is every first text frame from the start of the warm-up to the window's end, since with
many streams the first wave is what shows whether the server admits requests fairly.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

FIRST_TEXT = re.compile(rb'"(?:content|reasoning_content|reasoning)": ?"[^"]')
COMPLETION_TOKENS = re.compile(rb'"completion_tokens": ?(\d+)')
HEAD, LENGTH_BODY, CHUNKED_BODY = range(3)


class ProbeFailed(RuntimeError):
    """The request sent alone before the run did not stream a whole answer."""


@dataclass
class LoadStats:
    """What one closed-loop run measured; counts are for the window unless named otherwise."""

    phase: str = "probe"  # then "warmup", "window" (counting) and "over"
    frames: int = 0  # data frames received in the window
    completed: int = 0  # streams ended by [DONE] in the window
    rejected: int = 0  # 429 answers in the window
    errors: Counter[str] = field(default_factory=Counter)  # other statuses and failed connections
    # From sending the request to its first text frame, for every first frame before the window shuts (the
    # warm-up included: at high concurrency the first wave is the one that shows whether admission is fair).
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # between frames of one stream after its first text, in the window
    # Streams that ended with usage (those of the run, once one has): how many tokens one frame stands for.
    usage_tokens: int = 0
    usage_frames: int = 0

    def tokens(self) -> float:
        """Tokens delivered in the window: frames received times the tokens per frame of finished streams."""
        return self.frames * self.tokens_per_frame()

    def tokens_per_frame(self) -> float:
        return self.usage_tokens / self.usage_frames if self.usage_frames else 0.0


class StreamingConnection(asyncio.Protocol):
    """One keep-alive connection that carries one request at a time."""

    def __init__(self, stats: LoadStats) -> None:
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reply: asyncio.Future[int] | None = None
        self.sent_at = 0.0
        self.first_at: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(ConnectionError("connection closed mid-response"))

    def send(self, request: bytes) -> asyncio.Future[int]:
        """Send the request; the future gives the status once the whole response has arrived."""
        self.reply = asyncio.get_running_loop().create_future()
        self.state, self.head, self.body, self.sse = HEAD, b"", b"", b""
        self.status, self.remaining, self.close_after = 0, 0, False
        self.frames, self.last_frame, self.last_at, self.first_at = 0, b"", 0.0, None
        self.sent_at = time.perf_counter()
        assert self.transport is not None
        self.transport.write(request)
        return self.reply

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.state == HEAD:
            head = self.head + data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                self.head = head
                return
            self._read_head(head[:end])
            data = head[end + 4:]
        if self.state == LENGTH_BODY:
            self.remaining -= len(data)
            if self.remaining <= 0:
                self._finish()
            return
        buffer = self.body + data if self.body else data
        position = 0
        while True:  # chunked transfer coding: "<hex size>\r\n<payload>\r\n", a 0 size ends it
            eol = buffer.find(b"\r\n", position)
            if eol < 0:
                break
            size = int(buffer[position:eol].split(b";", 1)[0], 16)
            end = eol + 2 + size
            if end + 2 > len(buffer):
                break
            position = end + 2
            if size == 0:
                self._finish()
                return
            self._read_sse(buffer[eol + 2:end], now)
        self.body = buffer[position:]

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self.close_after = headers.get(b"connection") == b"close"
        if headers.get(b"transfer-encoding") == b"chunked":
            self.state = CHUNKED_BODY
        else:
            self.state = LENGTH_BODY
            self.remaining = int(headers.get(b"content-length", b"0"))

    def _read_sse(self, payload: bytes, now: float) -> None:
        if self.sse:
            payload = self.sse + payload
        frames = payload.split(b"\n\n")
        self.sse = frames.pop()  # an incomplete frame, or b""
        stats = self.stats
        for frame in frames:
            if not frame.startswith(b"data:"):
                continue  # a keep-alive comment
            if frame.startswith(b"data: [DONE]"):
                self._stream_done()
                continue
            self.frames += 1
            self.last_frame = frame
            counting = stats.phase == "window"
            if counting:
                stats.frames += 1
            if self.first_at is None:
                if FIRST_TEXT.search(frame):
                    self.first_at = self.last_at = now
                    if counting or stats.phase == "warmup":
                        stats.ttft.append(now - self.sent_at)
            else:
                if counting:
                    stats.gaps.append(now - self.last_at)
                self.last_at = now

    def _stream_done(self) -> None:
        stats = self.stats
        match = COMPLETION_TOKENS.search(self.last_frame)
        if match:
            stats.usage_tokens += int(match.group(1))
            stats.usage_frames += self.frames
        if stats.phase == "window":
            stats.completed += 1

    def _finish(self) -> None:
        self.state = HEAD
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(self.status)
        if self.close_after and self.transport is not None:
            self.transport.close()

    def waiting_since(self) -> float | None:
        """When the request in flight was sent, if it has had no text yet."""
        busy = self.reply is not None and not self.reply.done()
        return self.sent_at if busy and self.first_at is None else None


def build_request(host: str, port: int, path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class LoadResult:
    stats: LoadStats
    window: float  # seconds, measured
    client_cpu: float  # this process's CPU seconds in the window / window
    max_wait: float  # the longest TTFT seen or still waited for at the end of the window
    server_cpu: float  # server CPU seconds in the window (from the `server_cpu` callback)


async def run_load(host: str, port: int, request: bytes, concurrency: int, warmup: float, duration: float,
                   server_cpu: Callable[[], float], retry_pause: float = 0.1) -> LoadResult:
    """C closed-loop clients for warmup + duration seconds; `server_cpu()` is read when the window opens and shuts."""
    loop = asyncio.get_running_loop()
    stats = LoadStats()
    connections: list[StreamingConnection] = []

    async def client() -> None:
        while stats.phase != "over":
            try:
                _, connection = await loop.create_connection(lambda: StreamingConnection(stats), host, port)
            except OSError as exc:
                if stats.phase == "window":
                    stats.errors[f"connect: {exc.strerror or exc}"] += 1
                await asyncio.sleep(retry_pause)
                continue
            connections.append(connection)
            try:
                while stats.phase != "over" and not connection.closed:
                    status = await connection.send(request)
                    if status == 200:
                        continue
                    if stats.phase == "window":
                        if status == 429:
                            stats.rejected += 1
                        else:
                            stats.errors[str(status)] += 1
                    await asyncio.sleep(retry_pause)
            except ConnectionError:
                if stats.phase == "window":
                    stats.errors["connection lost"] += 1
            finally:
                connections.remove(connection)
                if connection.transport is not None:
                    connection.transport.abort()

    # One request alone first: it checks the server answers, and its usage gives the tokens per frame even when
    # no stream of the run ends inside the window (1,024 streams can take longer than the window).
    try:
        _, probe = await loop.create_connection(lambda: StreamingConnection(stats), host, port)
        try:
            status = await asyncio.wait_for(probe.send(request), timeout=60)
        finally:
            probe.transport.abort()  # type: ignore[union-attr]
    except (TimeoutError, OSError) as exc:  # ConnectionError is an OSError
        raise ProbeFailed(f"the first request failed: {exc!r}") from None
    if status != 200 or not stats.usage_frames:
        raise ProbeFailed(f"the first request got status {status} and no usage chunk")
    alone = stats.usage_tokens, stats.usage_frames
    stats.usage_tokens = stats.usage_frames = 0  # a stream under load may carry more tokens per frame

    stats.phase = "warmup"
    tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
    await asyncio.sleep(warmup)
    cpu_before, times_before, start = server_cpu(), os.times(), time.perf_counter()
    stats.phase = "window"
    await asyncio.sleep(duration)
    stats.phase = "over"
    cpu_after, times_after, end = server_cpu(), os.times(), time.perf_counter()
    if not stats.usage_frames:  # no stream of the run ended: the one sent alone is all we know
        stats.usage_tokens, stats.usage_frames = alone
    waits = [end - sent for sent in (c.waiting_since() for c in connections) if sent is not None]
    for connection in connections:
        if connection.transport is not None:
            connection.transport.abort()
    await asyncio.wait(tasks, timeout=10)
    for task in tasks:
        task.cancel()
    window = end - start
    client_cpu = (times_after.user + times_after.system - times_before.user - times_before.system) / window
    return LoadResult(stats, window, client_cpu, max([*stats.ttft, *waits], default=0.0), cpu_after - cpu_before)
