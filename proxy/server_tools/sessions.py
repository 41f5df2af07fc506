"""The MCP sessions of one response: one per (server URL, headers), opened on first use, closed together.

`async with McpSessions(limits) as sessions:` around the whole tool loop. Leaving the block closes every
session, so cancelling the response's task (a client that disconnects, a background response cancelled) also
ends a call in flight: the SDK tells the server to cancel it and the connection closes.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from proxy.server_tools.allow import McpAllowList
from proxy.server_tools.connect import McpServerError
from proxy.server_tools.headers import ServerHeaders
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.session import McpSession


class McpSessions:
    def __init__(self, limits: McpLimits | None = None, allow: McpAllowList | None = None) -> None:
        """`allow`: the --mcp-allow list every request to a client's server must pass, redirects included."""
        self.limits = limits or McpLimits()
        self._allow = allow
        self._open: dict[tuple[str, ServerHeaders], McpSession] = {}
        self._failed: dict[tuple[str, ServerHeaders], McpServerError] = {}
        self._connecting = asyncio.Lock()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        sessions = list(self._open.values())
        self._open.clear()
        for session in sessions:  # at once: should this task be cancelled while waiting, they still close
            session.request_close()
        await asyncio.gather(*(session.close() for session in sessions))

    @property
    def opened(self) -> int:
        """How many sessions are open."""
        return len(self._open)

    async def get(self, url: str, headers: ServerHeaders | None = None) -> McpSession:
        """The session for `url` with these headers, connecting on first use; McpServerError when the server
        cannot be reached (remembered: the response does not try the same server again)."""
        key = (url, headers or ServerHeaders())
        async with self._connecting:
            if key in self._failed:
                raise self._failed[key]
            session = self._open.get(key)
            if session is None:
                try:
                    # A URL the list does not allow reached here only as an operator's --tool-server.
                    allow = self._allow if self._allow and self._allow.permits(url) else None
                    session = await McpSession.connect(url, key[1], self.limits, allow)
                except McpServerError as exc:
                    self._failed[key] = exc
                    raise
                self._open[key] = session
        return session
