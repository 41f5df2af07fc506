"""Connecting the `mcp` SDK's Client to a server URL, choosing the transport (transport.py), and saying what went
wrong when that fails, in words safe to show a client (no header value, no userinfo, no query)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx2
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

from proxy.server_tools.allow import McpAllowList, parse_target
from proxy.server_tools.headers import ServerHeaders
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.transport import (
    SSE,
    STREAMABLE_HTTP,
    AllowedOnly,
    FirstStatus,
    http_sse,
    streamable_http,
    transport_for,
)

CLIENT_INFO = Implementation(name="harmony-proxy", version="0.1.0")
_REASON_CHARS = 500


class McpServerError(Exception):
    """The MCP server could not be reached or listed; the message is safe to show the client."""


async def connect(stack: AsyncExitStack, url: str, headers: ServerHeaders, limits: McpLimits,
                  scrub: Callable[[str], str], allow: McpAllowList | None = None) -> tuple[Client, str]:
    """A connected Client for `url` and the transport it uses; its closing is pushed onto `stack`, which the
    calling task must close itself (the SDK's task groups are bound to it). McpServerError when it fails.
    Every request goes to a URL `allow` allows (None: the operator's own server); messages pass `scrub`."""
    kind = transport_for(url)
    allowed = AllowedOnly(allow)
    if kind == STREAMABLE_HTTP:
        first = FirstStatus()
        try:
            transport = streamable_http(url, headers, limits, first, allowed)
            return await _enter(stack, Client(transport, **_options()), limits), kind
        except Exception as exc:  # noqa: BLE001 - reported below, or answered by trying SSE
            if allowed.refused or not first.means_no_streamable_http:
                raise McpServerError(f"Could not connect to the MCP server at {shown(url)}: "
                                     f"{allowed.refused or describe(exc, scrub)}") from None
    try:
        return await _enter(stack, Client(http_sse(url, headers, limits, allowed), **_options()), limits), SSE
    except Exception as exc:  # noqa: BLE001 - reported, safely
        tried = "over SSE" if kind == SSE else "over streamable HTTP (HTTP 4xx) or SSE"
        raise McpServerError(f"Could not connect to the MCP server at {shown(url)} {tried}: "
                             f"{allowed.refused or describe(exc, scrub)}") from None


async def _enter(stack: AsyncExitStack, client: Client, limits: McpLimits) -> Client:
    async with asyncio.timeout(limits.connect_timeout):
        return await stack.enter_async_context(client)


def _options() -> dict[str, Any]:
    # The SDK's own response cache would keep listings per client; tool lists are cached in tool_cache.py.
    return {"client_info": CLIENT_INFO, "cache": None}


def describe(exc: BaseException, scrub: Callable[[str], str]) -> str:
    """A short, safe account of what went wrong: the innermost error, no secret of the client's quoted."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        text = "timed out"
    elif isinstance(exc, MCPError):
        text = f"MCP error {exc.code}: {exc.message}"
    elif isinstance(exc, httpx2.HTTPStatusError):
        text = f"HTTP {exc.response.status_code}"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = scrub(text)
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."


def shown(url: str) -> str:
    """The URL for messages: no userinfo, query or fragment."""
    try:
        return parse_target(url)[0].shown()
    except ValueError:
        return "the configured URL"
