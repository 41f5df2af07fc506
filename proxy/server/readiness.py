"""The listening socket, and "Uvicorn running on ..." logged when it is true.

uvicorn logs that line when it binds the socket, but the socket only accepts connections once a server calls
`listen()` on it, after the application started: seconds later on a loaded machine (the vocabulary and the engine
load in between), and with `--workers` after every worker process started. Scripts wait for the line, then
connect. So the socket is bound here without the line, and the line is logged once a server serves on it: by
`Server` below in one process, by the supervisor (`proxy/server/supervisor.py`) once its workers serve.
"""

from __future__ import annotations

import logging
import socket

import uvicorn

from proxy.server.arguments import StartupError

uvicorn_logger = logging.getLogger("uvicorn.error")  # the line is uvicorn's, in its logger, as scripts expect


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, as uvicorn binds one (workers inherit it), not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def announce(sock: socket.socket) -> None:
    """The line scripts wait for: the socket accepts connections now."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    uvicorn_logger.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", shown, port)


class Server(uvicorn.Server):
    """uvicorn's server, which says it runs once it serves on its sockets."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:
            announce(sockets[0])
