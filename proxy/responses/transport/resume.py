"""`GET /v1/responses/{id}?stream=true[&starting_after=N]`: a background response's streaming events, resumed.

A background run saves its events (as SSE frames, numbered as a streamed create numbers them) with its progress
(`proxy/responses/transport/jobs.py`), so any process sharing the store replays them, those after `starting_after` only,
then polls the store for more until the response has ended. Once the store shows it ended, the events read after
are all there are (the final save writes both at once), so the stream ends after them. The poll stops when the
client leaves (the stream is cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from starlette.datastructures import QueryParams

from proxy.errors import invalid_request
from proxy.store.base import UNFINISHED, ResponseStore

POLL_EVERY = 0.1  # seconds between looks for new events while the response runs


def starting_after(query: QueryParams) -> int:
    """The `starting_after` sequence number (-1 when absent: every event)."""
    value = query.get("starting_after")
    if value is None:
        return -1
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0 or str(number) != value.strip():
        raise invalid_request("`starting_after` must be a sequence number (an integer of 0 or more).",
                              param="starting_after")
    return number


async def resumed_frames(store: ResponseStore, response_id: str, after: int,
                         poll_every: float = POLL_EVERY) -> AsyncGenerator[bytes, None]:
    while True:
        status, frames = await store.events(response_id, after)
        if frames:
            after += len(frames)
            yield "".join(frames).encode()
        if status is None or status not in UNFINISHED:  # ended (or deleted meanwhile): nothing more comes
            return
        await asyncio.sleep(poll_every)
