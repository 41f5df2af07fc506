"""Server-sent events, written straight to the ASGI `send`.

A stream is an async iterator of bytes; each item holds the whole SSE frames of one engine step, and is one
`send`, made with those of the other streams at the end of the loop's turn (`proxy/frame_writes.py`). Nothing
else runs per frame: a watcher task per stream (not per frame) notices the client leaving, which cancels the
stream (closing the frame iterator, and so the engine request), and a timer keeps idle proxies open with a
comment while the model thinks. sse-starlette wrapped every frame in a cancel scope and a
timeout, which cost more than everything else on the token path (the profile in the README's benchmarks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.disconnect import close_shielded
from proxy.frame_writes import FrameWrites, StreamWriter

RAW_SEND = "harmony_proxy.send"  # scope key of the server's own `send` (see KeepRawSend)
FRAME_WRITES = "harmony_proxy.frame_writes"  # scope key of the app's FrameWrites (see KeepRawSend)
DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"
_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
]


def data_frame(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


class EventStream:
    """A `text/event-stream` response (an ASGI application, as Starlette responses are)."""

    def __init__(self, frames: AsyncIterator[bytes], ping_interval: float = 15.0) -> None:
        self._frames = frames
        self._ping_interval = ping_interval
        self._client_left = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        send = scope.get(RAW_SEND, send)  # the framework knows the response started; frames go past its wrappers
        writes: FrameWrites = scope.get(FRAME_WRITES) or FrameWrites()  # outside KeepRawSend: the stream's own
        # The frames are pumped by a task of their own: resuming it after each engine step then goes through a
        # few coroutine frames, not through every middleware layer that awaits this response.
        loop = asyncio.get_running_loop()
        pings = _Pings(send, self._ping_interval)
        pump = loop.create_task(self._pump(send, writes.writer(send), pings))
        watcher = loop.create_task(self._watch(receive, pump))
        try:
            await pump
        except asyncio.CancelledError:
            if not self._client_left:
                pump.cancel()  # we are cancelled (server shutdown): so is the stream
                raise
        finally:
            watcher.cancel()
            pings.cancel()

    async def _pump(self, send: Send, writer: StreamWriter, pings: _Pings) -> None:
        """Each frame is written with those of the other streams in this turn (proxy/frame_writes.py)."""
        try:
            async for chunk in self._frames:
                if writer.waiting:
                    await writer.ready()
                writer.queue(chunk)
            await writer.drain()
            await pings.stop()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            writer.discard()
            await close_shielded(self._frames)  # type: ignore[arg-type]

    async def _watch(self, receive: Receive, pump: asyncio.Task[None]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._client_left = True
        pump.cancel()


class _Pings:
    """A comment frame every `interval` seconds, so idle proxies keep the stream open while the model thinks.

    A timer, not a timeout on the watcher's `receive` (`asyncio.wait_for` costs two tasks per request); a ping is
    sent by a task of its own, between two frames (`send` only waits when the client stops reading)."""

    def __init__(self, send: Send, interval: float) -> None:
        self._send = send
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(interval, self._due)
        self._sending: asyncio.Task[None] | None = None

    def _due(self) -> None:
        if self._sending is None or self._sending.done():
            self._sending = self._loop.create_task(self._ping())
        self._timer = self._loop.call_later(self._interval, self._due)

    async def _ping(self) -> None:
        await self._send({"type": "http.response.body", "body": PING, "more_body": True})

    async def stop(self) -> None:
        """No more pings; one on its way is sent first (nothing may follow the stream's end)."""
        self._timer.cancel()
        if self._sending is not None:
            await self._sending

    def cancel(self) -> None:
        self._timer.cancel()
        if self._sending is not None:
            self._sending.cancel()


class KeepRawSend:
    """ASGI middleware: keep the server's `send`, and the app's `FrameWrites`, in the scope for `EventStream`.

    Starlette wraps `send` in a coroutine at two layers (to know whether a response started); per frame that
    was a tenth of the server's CPU in the profile. The start of a stream still goes through them. It wraps the
    whole middleware stack (`proxy/app.py`), so the `send` it keeps is the server's own.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.frame_writes = FrameWrites()  # the streams of this app write their frames together

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
            scope[FRAME_WRITES] = self.frame_writes
        await self.app(scope, receive, send)
