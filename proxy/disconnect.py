"""Noticing a client that goes away, so the engine stops working for nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so its engine request) at once if the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()  # we are cancelled ourselves (shutdown): the work must not outlive us
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientDisconnected()


async def client_gone_handler(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it; the status tells the access log the client left


async def close_shielded(generator: AsyncGenerator[object, None]) -> None:
    """Close a generator even from a cancelled task: its cleanup is what cancels the engine request."""
    with anyio.CancelScope(shield=True):
        await generator.aclose()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
