"""Accept every waiting connection at once, however busy the event loop is.

uvloop (libuv) takes one pending connection off a listening socket per loop iteration when the loop has other
work ready. With 1,000 streams running, an iteration takes ~30 ms, so a burst of 1,000 new connections sat in
the kernel's accept queue for up to 7 s while the first ones streamed (TTFT p99 19x the p50 at 1,024 streams;
asyncio's own loop takes up to 100 connections per wake-up). A second reader on a duplicate of each listening
socket empties the queue whenever it is readable and hands each connection to the server's protocol, exactly as
the server's own accept would; the loop's accept then finds the queue empty.

uvicorn runs on `new_event_loop` (its `loop` setting, see `proxy/server/serving.py`) where uvloop is installed;
asyncio's own loop needs none of this.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvloop

logger = logging.getLogger("harmony_proxy")

MAX_ACCEPTS_PER_WAKE = 1024  # bounded, so a connection flood still lets streams take turns
# Descriptors left free at the end of a wake: the connections accepted in it are counted against --max-connections
# (proxy/server/connections.py) only when they start, so a wake stops early near the limit and lets that shed idle ones.
_HEADROOM = 64


def accept_eagerly(listener: socket.socket, protocol_factory: Callable[[], asyncio.Protocol]) -> Callable[[], None]:
    """Drain `listener`'s accept queue on every wake-up of the running loop; returns the function that stops it."""
    loop = asyncio.get_running_loop()
    duplicate = socket.socket(fileno=os.dup(listener.fileno()))
    duplicate.setblocking(False)
    is_tcp = listener.family in (socket.AF_INET, socket.AF_INET6)
    soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    ceiling = sys.maxsize if soft_limit == resource.RLIM_INFINITY else soft_limit - _HEADROOM  # lowest free first

    def accept_waiting() -> None:
        for _ in range(MAX_ACCEPTS_PER_WAKE):
            try:
                connection, _ = duplicate.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, for one: the loop's own accept will retry later
                logger.warning("could not accept a connection: %s", exc)
                return
            connection.setblocking(False)
            if is_tcp:
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loop's accept does
            loop.create_task(loop.connect_accepted_socket(protocol_factory, connection))
            if connection.fileno() >= ceiling:
                return

    loop.add_reader(duplicate.fileno(), accept_waiting)

    def stop() -> None:
        loop.remove_reader(duplicate.fileno())
        duplicate.close()

    return stop


class EagerAcceptLoop(uvloop.Loop):
    """uvloop, with the listening sockets of every server it creates drained by `accept_eagerly`.

    A loop rather than a server class, so that uvicorn builds it wherever it serves (`new_event_loop` is its
    `loop` setting): in the one server process, and in each `--workers` process its supervisor starts."""

    async def create_server(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.Protocol], *args: Any, **kwargs: Any
    ) -> _EagerServer:
        server = await super().create_server(protocol_factory, *args, **kwargs)
        stops = [accept_eagerly(listener, protocol_factory) for listener in server.sockets]
        logger.info("process %d accepts every waiting connection at once", os.getpid())
        return _EagerServer(server, stops)


def new_event_loop() -> asyncio.AbstractEventLoop:
    return EagerAcceptLoop()


class _EagerServer:
    """The loop's server; closing it stops the eager accept too (no new connections while shutting down)."""

    def __init__(self, server: asyncio.AbstractServer, stops: list[Callable[[], None]]) -> None:
        self._server, self._stops = server, stops

    def close(self) -> None:
        for stop in self._stops:
            stop()
        self._stops = []
        self._server.close()

    def __getattr__(self, name: str) -> Any:  # sockets, wait_closed, ...: the loop's server answers
        return getattr(self._server, name)
