"""How to reach an MCP server over HTTP: streamable HTTP (the current transport) or HTTP+SSE (the old one).

A URL whose last path segment is `sse` (`http://host:8001/sse`, as gpt-oss's and FastMCP's SSE servers and vLLM's
`--tool-server` spell it) is reached over SSE at once. Any other URL is tried with streamable HTTP first; when the
server answers that first POST with 400, 404 or 405 it does not speak streamable HTTP there, and the URL is tried
again as an SSE endpoint (a GET expecting an `endpoint` event): the fallback the MCP specification gives clients
for servers of the 2024-11-05 protocol. Other failures (refused connections, 401, 5xx) are reported as they are.

The URL a client named passed `--mcp-allow`, but the server may send the SDK elsewhere on its origin: a redirect
(`/mcp/x` -> `/admin/mcp`), an SSE `endpoint` event (`/admin/messages`). So every request the HTTP client is about
to send, each hop of a redirect included, is checked against the allow-list again (`AllowedOnly`), with the
client's headers still unsent.

httpx2 logs every request's URL at INFO: a token in a `server_url` query would be in the server's log. Its log
records (and the MCP client's) name URLs without their query (`_UrlsWithoutSecrets`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from proxy.server_tools.allow import McpAllowList, McpUrlRefused, parse_target
from proxy.server_tools.headers import REDACTED, ServerHeaders
from proxy.server_tools.limits import McpLimits

STREAMABLE_HTTP = "streamable-http"
SSE = "sse"
FALLBACK_STATUSES = frozenset({400, 404, 405})
_STREAM_READ_TIMEOUT = 300.0  # a server may hold its event stream open, silent, between messages (the SDK's default)


class _UrlsWithoutSecrets(logging.Filter):
    """Log records of the HTTP and MCP clients with every URL's query replaced (it may carry a token)."""

    _QUERY = re.compile(r"(\w+://[^\s?#'\"<>]+)\?[^\s#'\"<>]*")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "?" in message:
            record.msg, record.args = self._QUERY.sub(rf"\1?{REDACTED}", message), ()
        return True


# The libraries' own loggers (a logger's filters apply to the records it makes), once per process.
for _name in ["httpx2", *(name for name in logging.root.manager.loggerDict if name.startswith("mcp.client"))]:
    logging.getLogger(_name).addFilter(_UrlsWithoutSecrets())


class AllowedOnly:
    """An httpx2 request hook that refuses, before it is sent, a request to a URL the allow-list does not allow
    (`allow` None: an operator's --tool-server, not checked); `refused` says where the server tried to send it."""

    def __init__(self, allow: McpAllowList | None) -> None:
        self._allow = allow
        self.refused: str | None = None

    def hooks(self) -> list[Callable[[httpx2.Request], Awaitable[None]]]:
        return [] if self._allow is None else [self]

    async def __call__(self, request: httpx2.Request) -> None:
        url = str(request.url)
        if self._allow is not None and not self._allow.permits(url):
            try:
                where = parse_target(url)[0].shown()
            except McpUrlRefused:
                where = "a URL that is no valid MCP server URL"
            self.refused = (f"the server sent this one on to {where}, which no --mcp-allow prefix allows; nothing "
                            "was sent there")
            raise McpUrlRefused(self.refused)


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
async def streamable_http(url: str, headers: ServerHeaders, limits: McpLimits, first: FirstStatus,
                          allowed: AllowedOnly) -> AsyncIterator[TransportStreams]:
    """The SDK's streamable HTTP transport on an HTTP client of our own, which sends the headers, reports
    its first response's status to `first`, and reaches only what `allowed` allows."""
    timeout = httpx2.Timeout(limits.connect_timeout, read=_STREAM_READ_TIMEOUT)
    http = httpx2.AsyncClient(headers=headers.values(), timeout=timeout,
                              event_hooks={"request": allowed.hooks(), "response": [first]})
    async with http, streamable_http_client(url, http_client=http,
                                            max_sse_event_size=limits.max_event_bytes) as streams:
        yield streams


def http_sse(url: str, headers: ServerHeaders, limits: McpLimits,
             allowed: AllowedOnly) -> AbstractAsyncContextManager[TransportStreams]:
    """The SDK's HTTP+SSE transport, sending the headers on the stream's GET and on every POST (to the URL of
    the `endpoint` event), each to a URL `allowed` allows."""

    def client(headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None,
               auth: httpx2.Auth | None = None) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth,
                                  event_hooks={"request": allowed.hooks()})

    return sse_client(url, headers=headers.values(), timeout=limits.connect_timeout,
                      sse_read_timeout=_STREAM_READ_TIMEOUT, httpx_client_factory=client)
