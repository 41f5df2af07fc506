"""Stream frames written together: every stream's frames of one turn of the event loop go out back to back.

Why: a frame written to a socket whose reader sleeps costs the kernel a wake-up of that reader, billed to the
writer: 7-11 us of system time per frame when frames leave ~15 us apart (the Python work of the next stream in
between), 3-8 us when they leave back to back, as the reader is then often still busy with the previous ones
(benchmarks/send_floor.py); in the server at 64 streams, 8-9.5 us per frame fell to 6-8 us. So a stream queues its
frame here, and one callback per loop turn, scheduled by the first frame of the turn, writes them all. A frame
waits for the rest of the turn, not for a timer; a stream that queues twice in one turn (an engine that had
several steps waiting) has its frames joined in one write.

Each write is the server's ASGI `send`, driven by hand so that the whole batch goes out in one callback: it
finishes at once unless the client stopped reading (uvicorn then waits for the socket to drain), and only then
is it handed to a task of its own; its stream waits for that before queueing more (backpressure per stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import CoroutineType
from typing import Any

from starlette.types import Send


class StreamWriter:
    """One stream's side: `queue` frames, `ready()` first when `waiting`, `drain()` before the response's end."""

    __slots__ = ("_batch", "_failed", "_queued", "_send", "_stalled")

    def __init__(self, batch: FrameWrites, send: Send) -> None:
        self._batch = batch
        self._send = send
        self._queued: bytes | None = None
        self._stalled: asyncio.Future[None] | None = None  # a write waiting for the client to read
        self._failed: Exception | None = None

    @property
    def waiting(self) -> bool:
        """An earlier write waits for the client, or failed: `await ready()` before queueing more."""
        return self._stalled is not None or self._failed is not None

    def queue(self, body: bytes) -> None:
        if self._queued is None:
            self._queued = body
            self._batch.add(self)
        else:
            self._queued += body  # rare: a stream that had several steps waiting

    async def ready(self) -> None:
        """Wait while an earlier write waits for the client; raise what a write raised."""
        if self._stalled is not None:
            stalled, self._stalled = self._stalled, None
            await stalled
        if self._failed is not None:
            raise self._failed

    async def drain(self) -> None:
        """Write what is queued now, and wait until every write of this stream is done."""
        self.write()
        await self.ready()

    def discard(self) -> None:
        """The stream ended early (the client left, the server stops): drop what is queued or still waits."""
        self._queued = None
        if self._stalled is not None and not self._stalled.cancel() and not self._stalled.cancelled():
            self._stalled.exception()  # it failed already: taken here, where nobody will ask any more

    def write(self) -> None:
        queued, self._queued = self._queued, None
        if queued is None:  # written already (drain) or discarded
            return
        written = self._send({"type": "http.response.body", "body": queued, "more_body": True})
        if type(written) is not CoroutineType:  # an awaitable of another kind: a task awaits it
            self._stalled = asyncio.ensure_future(written)
            return
        try:
            waiting = written.send(None)
        except StopIteration:
            return  # written: the usual case
        except Exception as exc:  # noqa: BLE001 - raised to the stream at its next frame, as an awaited send is
            self._failed = exc
            return
        self._stalled = asyncio.get_running_loop().create_task(_finish(written, waiting))  # type: ignore[arg-type]
        # Cancelled (discard), even before it ran: end the send where it waits; a no-op once it returned.
        self._stalled.add_done_callback(lambda _: written.close())


class FrameWrites:
    """The frames of every stream on this event loop, written once per turn of the loop (see module doc)."""

    def __init__(self) -> None:
        self._writers: list[StreamWriter] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def writer(self, send: Send) -> StreamWriter:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # another loop (tests run several): what waited on the old one never will
            self._loop, self._writers = loop, []
        return StreamWriter(self, send)

    def add(self, writer: StreamWriter) -> None:
        if not self._writers:  # the first frame of this turn
            self._loop.call_soon(self._write_all)  # type: ignore[union-attr]
        self._writers.append(writer)

    def _write_all(self) -> None:
        writers, self._writers = self._writers, []
        for writer in writers:
            writer.write()


async def _finish(written: Coroutine[Any, Any, Any], waiting: Any) -> None:
    """Go on with a `send` that waited, as a task would: wait for what it waits on, resume it, until it ends."""
    while True:
        if waiting is None:
            await asyncio.sleep(0)  # a bare yield asks for one turn of the loop
        else:
            await asyncio.wait((waiting,))  # not its result: the send reads that itself when resumed
        try:
            waiting = written.send(None)
        except StopIteration:
            return
