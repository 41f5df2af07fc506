"""Noticing a client that goes away, so the engine stops working for nobody."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar, cast

import anyio
from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so its engine request) at once if the client disconnects.

    `work` runs in this task, and one watcher task cancels this task if the client leaves: every request pays
    this, so it is one task and no `asyncio.wait` (a task for the work too, and the wait, cost twice as much)."""
    task = cast("asyncio.Task[object]", asyncio.current_task())  # a coroutine awaited here runs in a task
    watcher = asyncio.get_running_loop().create_task(_cancel_when_gone(request, task))
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():  # the watcher cancelled us: the client left
            task.uncancel()
            raise ClientDisconnected() from None
        raise  # we are cancelled ourselves (shutdown)
    finally:
        watcher.cancel()


async def client_gone_handler(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it; the status tells the access log the client left


async def close_shielded(generator: AsyncGenerator[object, None]) -> None:
    """Close a generator even from a cancelled task: its cleanup is what cancels the engine request."""
    if generator.ag_frame is None:  # finished: nothing to clean up, and a cancel scope per request is not free
        return
    with anyio.CancelScope(shield=True):
        await generator.aclose()


async def _cancel_when_gone(request: Request, task: asyncio.Task[object]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()
