"""Accept every waiting connection at once, however busy the event loop is.

uvloop (libuv) takes one pending connection off a listening socket per loop iteration when the loop has other
work ready. With 1,000 streams running, an iteration takes ~30 ms, so a burst of 1,000 new connections sat in
the kernel's accept queue for up to 7 s while the first ones streamed (TTFT p99 19x the p50 at 1,024 streams;
asyncio's own loop takes up to 100 connections per wake-up). A second reader on a duplicate of each listening
socket empties the queue whenever it is readable and hands each connection to the server's protocol, exactly as
the server's own accept would; the loop's accept then finds the queue empty.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import uvicorn

logger = logging.getLogger("harmony_proxy")

MAX_ACCEPTS_PER_WAKE = 1024  # bounded, so a connection flood still lets streams take turns


def accept_eagerly(listener: socket.socket, protocol_factory: Callable[[], asyncio.Protocol]) -> Callable[[], None]:
    """Drain `listener`'s accept queue on every wake-up of the running loop; returns the function that stops it."""
    loop = asyncio.get_running_loop()
    duplicate = socket.socket(fileno=os.dup(listener.fileno()))
    duplicate.setblocking(False)
    is_tcp = listener.family in (socket.AF_INET, socket.AF_INET6)

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

    loop.add_reader(duplicate.fileno(), accept_waiting)

    def stop() -> None:
        loop.remove_reader(duplicate.fileno())
        duplicate.close()

    return stop


class Server(uvicorn.Server):
    """uvicorn's server, with every listening socket drained by `accept_eagerly`."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit:
            return
        config = self.config

        def protocol() -> asyncio.Protocol:  # what uvicorn's startup gives its listeners
            return config.http_protocol_class(config=config, server_state=self.server_state,
                                              app_state=self.lifespan.state)

        self._stop_accepting = [accept_eagerly(listener, protocol)
                                for server in self.servers for listener in server.sockets]

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for stop in getattr(self, "_stop_accepting", ()):
            stop()  # no new connections from here on, as uvicorn closes its listeners
        await super().shutdown(sockets)
