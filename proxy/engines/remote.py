"""`RemoteEngine`: an engine in another process, the engine host (host.py), reached over a Unix socket.

An HTTP front end of a multi-process server uses it as its engine: it renders, parses and serializes itself,
and only token ids cross the process boundary. `start()` returns at once and connects in the background,
retrying while the host is still loading the model; until the host has greeted it, `ready` is False, so
/health answers 503 and requests are refused with 503. If the host goes away, running requests fail with a
503 `EngineError`, `ready` turns False, and the engine reconnects when a host listens again. Closing a
request's generator early sends CANCEL, and the host aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any, cast

from proxy.engines import wire
from proxy.engines.base import ContextWindow, EngineError, GenerationRequest, Step

logger = logging.getLogger("harmony_proxy.engine")

# What a request's inbox holds: steps, then a last Step, an EngineError, or None (ended without a finish reason).
_Item = Step | EngineError | None


class RemoteEngine:
    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        name: str = "trtllm",
        retry_interval: float = 0.25,
        health_timeout: float = 5.0,
    ) -> None:
        self.name = name  # the host's engine: messages say "the trtllm engine is starting"
        self._path = os.fspath(socket_path)
        self._retry_interval = retry_interval
        self._health_timeout = health_timeout
        self._link: _Link | None = None
        self._connector: asyncio.Task[None] | None = None
        # What the host's built engine takes, from its greeting: None until then (and for engines that say nothing).
        self.context_window: ContextWindow | None = None
        self.kv_event_sources: dict[str, Any] | None = None  # where the host's engine publishes its KV-cache events
        self._closing = False

    @property
    def ready(self) -> bool:
        return self._link is not None and self._link.alive and not self._closing

    async def check_health(self) -> None:
        link = self._link
        if link is None or not link.alive:
            raise self._unavailable()
        await link.check_health(self._health_timeout)

    async def start(self) -> None:
        self._connector = asyncio.get_running_loop().create_task(self._stay_connected())

    async def close(self) -> None:
        self._closing = True
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connector
        if self._link is not None:
            self._link.close()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        link = self._link
        if link is None or not link.alive or self._closing:
            raise self._unavailable()
        handle, inbox = link.submit(request)
        items = inbox.items
        done = False
        try:
            while True:
                if not items:
                    await inbox.wait()
                item = items.popleft()
                if type(item) is Step:
                    # Steps that arrived while we were busy go on as one: one frame for the client, not many.
                    while items and type(items[0]) is Step and item.finish_reason is None:
                        later = items.popleft()
                        item = Step([*item.token_ids, *later.token_ids], later.finish_reason, later.usage)
                    if item.finish_reason is None:
                        yield item
                        continue
                    done = True
                    yield item
                    return
                done = True
                if item is None:
                    return
                raise item
        finally:
            if not done:
                link.cancel(handle)  # the consumer stopped early: the host aborts the request

    async def _stay_connected(self) -> None:
        loop = asyncio.get_running_loop()
        waiting_logged = False
        while True:
            link = None
            try:
                _, link = await loop.create_unix_connection(lambda: _Link(self.name), self._path)
                host_engine, self.context_window, self.kv_event_sources = await link.greeted
            except (OSError, EngineError, wire.ProtocolError) as exc:
                if not waiting_logged and isinstance(exc, wire.ProtocolError):
                    logger.error("the engine host at %s: %s", self._path, exc)
                elif not waiting_logged:
                    logger.info("waiting for the engine host at %s", self._path)
                waiting_logged = True
                await asyncio.sleep(self._retry_interval)
                continue
            except asyncio.CancelledError:
                if link is not None:
                    link.close()  # closed while the host was greeting us
                raise
            self._link = link
            logger.info("connected to the engine host at %s (the %s engine)", self._path, host_engine)
            await link.lost
            logger.warning("lost the engine host at %s; reconnecting", self._path)
            waiting_logged = False

    def _unavailable(self) -> EngineError:
        if self._closing:
            return EngineError(f"The {self.name} engine is shutting down.", 503, "engine_shutting_down")
        return EngineError(
            f"The {self.name} engine process is not reachable (starting or restarting); retry shortly.",
            503,
            "engine_unavailable",
        )


class _Inbox:
    """The items received for one request, and a way to wait for the next."""

    __slots__ = ("_waiter", "items")

    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: _Item) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None


class _Link(asyncio.Protocol):
    """One connection to the host: the requests it carries, by handle."""

    def __init__(self, engine_name: str) -> None:
        loop = asyncio.get_running_loop()
        self.greeted: asyncio.Future[wire.Greeting] = loop.create_future()  # the host's greeting
        self.lost: asyncio.Future[None] = loop.create_future()
        self.alive = False  # greeted and not lost
        self._engine_name = engine_name
        self._inboxes: dict[int, _Inbox] = {}
        self._health_checks: dict[int, asyncio.Future[None]] = {}
        self._handles = itertools.count(1)
        self._reader = wire.FrameReader(self._received)
        self._loop = loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self._writer = wire.FrameWriter(self._transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except Exception as exc:
            if not self.greeted.done():
                if not isinstance(exc, wire.ProtocolError):
                    exc = wire.ProtocolError(f"not an engine host: {exc!r}")
                self.greeted.set_exception(exc)
            else:
                logger.exception("the engine host sent what is not a frame; reconnecting")
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        for inbox in self._inboxes.values():
            inbox.put(self._gone())
        self._inboxes.clear()
        for check in self._health_checks.values():
            if not check.done():
                check.set_exception(self._gone())
        if not self.greeted.done():
            self.greeted.set_exception(self._gone())
        if not self.lost.done():  # cancelled when the engine closed
            self.lost.set_result(None)

    def close(self) -> None:
        self._transport.close()

    def submit(self, request: GenerationRequest) -> tuple[int, _Inbox]:
        handle = next(self._handles) & 0xFFFFFFFF
        inbox = self._inboxes[handle] = _Inbox()
        self._writer.send(wire.request_frame(handle, request))
        return handle, inbox

    def cancel(self, handle: int) -> None:
        if self._inboxes.pop(handle, None) is not None and self.alive:
            self._writer.send(wire.frame(wire.CANCEL, handle))

    async def check_health(self, timeout: float) -> None:
        handle = next(self._handles) & 0xFFFFFFFF
        answer = self._health_checks[handle] = self._loop.create_future()
        self._writer.send(wire.frame(wire.HEALTH, handle))
        try:
            await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise EngineError(
                f"The {self._engine_name} engine process did not answer a health check in {timeout:g} s.",
                503,
                "engine_unresponsive",
            ) from None
        finally:
            self._health_checks.pop(handle, None)

    def _received(self, kind: int, handle: int, data: bytes, start: int, end: int) -> None:
        if kind == wire.STEP:
            inbox = self._inboxes.get(handle)
            if inbox is not None:  # else cancelled meanwhile
                inbox.put(Step(wire.read_tokens(data, start, end)))
        elif kind == wire.LAST:
            inbox = self._inboxes.pop(handle, None)
            if inbox is not None:
                last = wire.read_last(data, start, end)
                inbox.put(last if last.finish_reason is not None else None)
        elif kind == wire.ERROR:
            error = wire.read_error(data[start:end])
            inbox = self._inboxes.pop(handle, None)
            if inbox is not None:
                inbox.put(error)
            elif (check := self._health_checks.get(handle)) is not None and not check.done():
                check.set_exception(error)
        elif kind == wire.HEALTHY:
            check = self._health_checks.get(handle)
            if check is not None and not check.done():
                check.set_result(None)
        elif kind == wire.HELLO:
            greeting = wire.read_hello(data[start:end])
            self.alive = True
            self.greeted.set_result(greeting)
        else:
            raise wire.ProtocolError(f"unknown frame kind {kind}")

    def _gone(self) -> EngineError:
        return EngineError(
            f"The {self._engine_name} engine process went away; retry shortly.", 503, "engine_unavailable"
        )
