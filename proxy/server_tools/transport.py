"""How to reach an MCP server over HTTP: streamable HTTP (the current transport) or HTTP+SSE (the old one).

A URL whose last path segment is `sse` (`http://host:8001/sse`, as gpt-oss's and FastMCP's SSE servers and vLLM's
`--tool-server` spell it) is reached over SSE at once. Any other URL is tried with streamable HTTP first; when the
server answers that first POST with 400, 404 or 405 it does not speak streamable HTTP there, and the URL is tried
again as an SSE endpoint (a GET expecting an `endpoint` event): the fallback the MCP specification gives clients
for servers of the 2024-11-05 protocol. Other failures (refused connections, 401, 5xx) are reported as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from proxy.server_tools.headers import ServerHeaders
from proxy.server_tools.limits import McpLimits

STREAMABLE_HTTP = "streamable-http"
SSE = "sse"
FALLBACK_STATUSES = frozenset({400, 404, 405})
_STREAM_READ_TIMEOUT = 300.0  # a server may hold its event stream open, silent, between messages (the SDK's default)


def transport_for(url: str) -> str:
    """The transport to try first for `url`."""
    path = httpx2.URL(url).path.rstrip("/")
    return SSE if path.rsplit("/", 1)[-1] == "sse" else STREAMABLE_HTTP


class FirstStatus:
    """Remembers the HTTP status of the first response a client got (an httpx2 response hook)."""

    def __init__(self) -> None:
        self.status: int | None = None

    async def __call__(self, response: httpx2.Response) -> None:
        if self.status is None:
            self.status = response.status_code

    @property
    def means_no_streamable_http(self) -> bool:
        return self.status in FALLBACK_STATUSES


@asynccontextmanager
async def streamable_http(url: str, headers: ServerHeaders, limits: McpLimits,
                          first: FirstStatus) -> AsyncIterator[TransportStreams]:
    """The SDK's streamable HTTP transport on an HTTP client of our own, which sends the headers and reports
    its first response's status to `first`."""
    timeout = httpx2.Timeout(limits.connect_timeout, read=_STREAM_READ_TIMEOUT)
    http = httpx2.AsyncClient(headers=headers.values(), timeout=timeout, event_hooks={"response": [first]})
    async with http, streamable_http_client(url, http_client=http, max_sse_event_size=limits.max_event_bytes) as streams:
        yield streams


def http_sse(url: str, headers: ServerHeaders, limits: McpLimits) -> AbstractAsyncContextManager[TransportStreams]:
    """The SDK's HTTP+SSE transport, sending the headers on the stream's GET and on every POST."""
    return sse_client(url, headers=headers.values(), timeout=limits.connect_timeout,
                      sse_read_timeout=_STREAM_READ_TIMEOUT)
