"""uvicorn's WebSocket protocol (websockets, sans I/O) parsing what it reads a slice at a time.

uvicorn parses all the bytes of one read in one callback: a read of 256 KiB of small frames is thousands of
messages parsed and queued before any other request of the process runs. Here a read is parsed `SLICE_BYTES` at a
time, one slice a turn of the event loop, and reading waits until what was read is parsed: a flood of small
messages takes its turn with every other request, and what is read ahead stays one read.

uvicorn pauses reading once a message is queued for the application and resumes when the application has taken
them all (`receive`); here it resumes only once the bytes read are parsed, too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

SLICE_BYTES = 8 * 1024  # parsed in one go: ~250 small frames, a millisecond or two


class SlicedWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unparsed = bytearray()  # read, not parsed yet
        self._next_slice: asyncio.Handle | None = None

    def data_received(self, data: bytes) -> None:
        if not self._unparsed and len(data) <= SLICE_BYTES:
            super().data_received(data)
            return
        self._unparsed += data
        self.transport.pause_reading()  # until the bytes read are parsed
        if self._next_slice is None:
            self._parse_slice()

    def _parse_slice(self) -> None:
        self._next_slice = None
        piece = bytes(self._unparsed[:SLICE_BYTES])
        del self._unparsed[:SLICE_BYTES]
        super().data_received(piece)
        if self._unparsed:
            if not self.transport.is_closing():
                self._next_slice = self.loop.call_soon(self._parse_slice)
            return
        if not self.read_paused or self.queue.empty():  # nothing waits for the application: read on
            self.read_paused = False
            self.transport.resume_reading()

    async def receive(self) -> Any:
        message = await self.queue.get()
        if self.read_paused and self.queue.empty() and not self._unparsed:
            self.read_paused = False
            self.transport.resume_reading()
        return message

    def connection_lost(self, exc: Exception | None) -> None:
        if self._next_slice is not None:
            self._next_slice.cancel()
            self._next_slice = None
        super().connection_lost(exc)
