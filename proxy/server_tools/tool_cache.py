"""Tool lists kept for a while, so that the responses of a chain (an agent's turns) do not list a server each turn.

Keyed by the server URL, a keyed hash of the headers (another client's token never reaches a list it may not
see, and the key holds no secret) and the allowed tool names. Bounded, least recently used first out, and
entries expire `ttl_seconds` after they were listed. One instance lives in the app state.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from proxy.server_tools.headers import ServerHeaders
from proxy.server_tools.listing import ServerTools
from proxy.server_tools.sessions import McpSessions

_Key = tuple[str, str, tuple[str, ...] | None]


class ToolListCache:
    def __init__(self, max_entries: int = 256, ttl_seconds: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._secret = secrets.token_bytes(32)
        self._entries: OrderedDict[_Key, tuple[float, ServerTools]] = OrderedDict()

    def get(self, url: str, headers: ServerHeaders, allowed: Iterable[str] | None) -> ServerTools | None:
        key = self._key(url, headers, allowed)
        entry = self._entries.get(key)
        if entry is None:
            return None
        listed_at, tools = entry
        if self._clock() - listed_at >= self.ttl_seconds:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return tools

    def put(self, url: str, headers: ServerHeaders, allowed: Iterable[str] | None, tools: ServerTools) -> None:
        if self.max_entries <= 0:
            return
        key = self._key(url, headers, allowed)
        self._entries[key] = (self._clock(), tools)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def list_tools(self, sessions: McpSessions, url: str, headers: ServerHeaders,
                         allowed: Iterable[str] | None) -> tuple[ServerTools, bool]:
        """The server's tools (only the allowed ones) and whether they came from the cache; a miss connects
        through `sessions` and lists (McpServerError when that fails)."""
        allowed = None if allowed is None else tuple(allowed)
        cached = self.get(url, headers, allowed)
        if cached is not None:
            return cached, True
        session = await sessions.get(url, headers)
        tools = (await session.list_tools()).only(allowed)
        self.put(url, headers, allowed, tools)
        return tools, False

    def __len__(self) -> int:
        return len(self._entries)

    def _key(self, url: str, headers: ServerHeaders, allowed: Iterable[str] | None) -> _Key:
        names = None if allowed is None else tuple(sorted(set(allowed)))
        return url, headers.fingerprint(self._secret), names
