"""Server-sent events: frames are formatted here as bytes, sent by sse-starlette (which also notices a
client that goes away and cancels the stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse

DONE = b"data: [DONE]\n\n"


def data_frame(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


def event_frame(event: str, payload: str) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + payload.encode() + b"\n\n"


def event_stream(frames: AsyncIterator[bytes]) -> EventSourceResponse:
    # Keep-alive comments every 15 s hold idle proxies open while the model thinks.
    return EventSourceResponse(frames, sep="\n", ping=15)
