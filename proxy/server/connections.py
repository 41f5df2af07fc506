"""Connections that hold a socket without making a request are closed (slowloris), and open connections are capped.

uvicorn closes a keep-alive connection that stays silent after a response (`--keep-alive-timeout`), but nothing
else: a connection that never sends a byte, one that trickles its request head, one whose next head stops half
way, or one that sends a body a byte a minute is held for ever, and at the descriptor limit every new client is
locked out. Each connection here has a deadline while it owes the server something:

- its request head, complete, within `--request-head-timeout` of connecting (or of the previous response ending,
  plus the keep-alive time it may stay silent);
- the rest of its body within `--request-body-timeout` of the head.

Once the request is in, the server owes the client: a stream may last as long as generation takes. And when
`--max-connections` are open, a new connection sheds the one that has waited longest without a request in flight,
so idle sockets go before any new client is refused (a 503, only when every connection is serving a request).
An upgraded WebSocket with no response in flight is idle too, whatever pings it answers (every client library
does): the application says when it is (`IDLE_EXTENSION`), and a shed one is closed with 1013, "try again later".

This is uvicorn's HTTP protocol (its `http` setting takes a protocol class) with deadlines at the points where its
parser reports a head, a body and a response complete, and its WebSocket protocol (its `ws` setting; parsed a slice
at a time, sliced_websocket.py) with the idle state. The guard of one server process knows its connections.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from websockets.http11 import Request

from proxy.server.sliced_websocket import SlicedWebSocketProtocol

logger = logging.getLogger("harmony_proxy")

# Descriptors kept for what is not a client connection: the store, the engine, upstream and MCP clients, logs.
_RESERVED_DESCRIPTORS = 64
_REFUSAL_BODY = b'{"error":{"message":"Too many open connections.","type":"server_error","param":null,"code":null}}'
_TRY_AGAIN_LATER = 1013
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_REFUSAL_BODY), _REFUSAL_BODY))


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout: float = 10.0  # seconds for a complete request head
    body_timeout: float = 60.0  # seconds for the rest of a body, from its head
    keep_alive_timeout: float = 5.0  # seconds a connection may stay silent after a response (uvicorn's)
    max_connections: int = 0  # open connections per process; 0: no cap


def raise_descriptor_limit(wanted: int = 65536) -> int:
    """Raise this process's soft limit on open files towards `wanted` (within the hard limit); the new soft limit.

    The default soft limit (often 1,024) holds fewer streams than one process serves; workers inherit the raised one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open-file limit from %d: %s", soft, exc)
    return soft


def default_max_connections(descriptor_limit: int) -> int:
    """Connections one process may hold: the descriptor limit less a reserve for everything else it opens."""
    return max(descriptor_limit - max(_RESERVED_DESCRIPTORS, descriptor_limit // 8), 16)


class ConnectionGuard:
    """One server process's connections that owe it a request head, longest waiting first: the ones to shed."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        # Connections that may be shed, insertion order: longest waiting first.
        self._waiting: dict[GuardedHttpToolsProtocol | GuardedWebSocketProtocol, None] = {}

    def protocol(self, **uvicorn_arguments: Any) -> GuardedHttpToolsProtocol:
        """uvicorn's `http` setting: it calls this with its config and server state for each connection."""
        return GuardedHttpToolsProtocol(guard=self, **uvicorn_arguments)

    def websocket_protocol(self, **uvicorn_arguments: Any) -> GuardedWebSocketProtocol:
        """uvicorn's `ws` setting: the protocol of each upgraded connection."""
        return GuardedWebSocketProtocol(guard=self, **uvicorn_arguments)

    def __getstate__(self) -> dict[str, Any]:  # sent to each --workers process: its own guard, no connections
        return {"limits": self.limits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limits"])  # type: ignore[misc]

    def admit(self, connection: GuardedHttpToolsProtocol, open_connections: int) -> bool:
        """A new connection: within the cap, or an older one waiting for a head is shed for it; False: refused."""
        cap = self.limits.max_connections
        if not cap or open_connections <= cap:
            return True
        oldest = next(iter(self._waiting), None)
        if oldest is None:
            return False
        logger.debug("%d connections open: closing the one that waited longest for a request", open_connections)
        oldest.close_waiting()
        return True

    def waiting(self, connection: GuardedHttpToolsProtocol | GuardedWebSocketProtocol, waits: bool) -> None:
        if waits:
            self._waiting[connection] = None
        else:
            self._waiting.pop(connection, None)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline while the client owes a head or a body."""

    def __init__(self, *, guard: ConnectionGuard, **uvicorn_arguments: Any) -> None:
        super().__init__(**uvicorn_arguments)
        self._guard = guard
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._guard.admit(self, len(self.connections)):
            logger.warning("%d connections open, each serving a request: a new one is refused (--max-connections)",
                           len(self.connections))
            self.connections.discard(self)
            transport.write(_REFUSAL)
            transport.close()
            return
        self._await_head(self._guard.limits.head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._stop_waiting()
        self._deadline = self.loop.call_later(self._guard.limits.body_timeout, self._timed_out, "its body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_deadline()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            limits = self._guard.limits
            self._await_head(limits.keep_alive_timeout + limits.head_timeout)

    def handle_websocket_upgrade(self) -> None:
        self._stop_waiting()  # the WebSocket protocol owns the connection from here
        super().handle_websocket_upgrade()

    def close_waiting(self) -> None:
        """Shed: the connection is closed while it has no request in flight."""
        self._stop_waiting()
        self.connections.discard(self)  # counted as closed now, not when the loop reports it lost
        self.transport.close()

    def _await_head(self, timeout: float) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(timeout, self._timed_out, "a request head")
        self._guard.waiting(self, True)

    def _stop_waiting(self) -> None:
        self._cancel_deadline()
        self._guard.waiting(self, False)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self, owed: str) -> None:
        self._deadline = None
        self._guard.waiting(self, False)
        if not self.transport.is_closing():
            logger.debug("closing a connection from %s: %s did not arrive in time", self.client, owed)
            self.transport.close()


class GuardedWebSocketProtocol(SlicedWebSocketProtocol):
    """uvicorn's WebSocket protocol (websockets, sans I/O; parsed a slice at a time), sheddable while the application
    says it is idle."""

    def __init__(self, *, guard: ConnectionGuard, **uvicorn_arguments: Any) -> None:
        super().__init__(**uvicorn_arguments)
        self._guard = guard

    def handle_connect(self, event: Request) -> None:
        # Here, not at the top: `--help` reads ConnectionLimits' defaults without importing the Responses API.
        from proxy.responses.transport.websocket import IDLE_EXTENSION

        super().handle_connect(event)
        if self.response.status_code == 101:  # accepted: the application may now say when it is idle
            self.scope["extensions"][IDLE_EXTENSION] = {"idle": self.idle}  # type: ignore[index]

    def idle(self, idle: bool) -> None:
        self._guard.waiting(self, idle and not self.close_sent and not self.disconnected)

    def close_waiting(self) -> None:
        """Shed: a close frame (1013: try again later), then the socket; counted as closed now."""
        self._guard.waiting(self, False)
        self.connections.discard(self)
        if not self.close_sent:
            self.close_sent = True
            self.conn.send_close(_TRY_AGAIN_LATER, "the server is at its connection limit")
            self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.waiting(self, False)
        self.connections.add(self)  # uvicorn's removes it, and a shed connection was counted as closed already
        super().connection_lost(exc)
