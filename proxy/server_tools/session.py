"""One MCP client session, on the `mcp` SDK: connect, list the server's tools, call them, close.

The SDK's Client holds anyio task groups: they must be entered and left by one task, and when a transport task
fails (the server went away) they cancel that task. So each session lives in a task of its own, which connects,
waits to be closed and closes: a dying server ends that task, never the response that uses the session, and the
session may be used and closed from any task.

Listing fails loudly (`McpServerError`: a response cannot offer tools it cannot list); a call never raises but
returns a failed `ToolOutput` the model is told about (the tool's own error, an MCP error, a timeout, a lost
connection). Only cancellation passes through, and then the SDK tells the server to stop the call
(`notifications/cancelled`); closing the session ends the connection (and a handshake-era session on the
server). Messages and outputs never quote a secret of the client's: a header value or a value of the URL's query.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import AsyncExitStack
from typing import Any

from mcp import Client

from proxy.server_tools.allow import McpAllowList, url_secrets
from proxy.server_tools.connect import McpServerError, connect, describe, shown
from proxy.server_tools.headers import ServerHeaders, scrubber
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.listing import McpTool, ServerTools
from proxy.server_tools.output import ToolOutput, capped, from_result

logger = logging.getLogger("harmony_proxy")
CLOSE_TIMEOUT = 5.0  # seconds a session may take to close before its task is cancelled


class McpSession:
    """A connected session (`await McpSession.connect(...)`); `close()` ends it."""

    def __init__(self, url: str, headers: ServerHeaders, limits: McpLimits, allow: McpAllowList | None = None) -> None:
        self.url = url
        self.transport = ""
        self._scrub = scrubber((*headers.secrets(), *url_secrets(url)))
        self._headers = headers
        self._limits = limits
        self._allow = allow
        self._client: Client | None = None
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, url: str, headers: ServerHeaders, limits: McpLimits,
                      allow: McpAllowList | None = None) -> McpSession:
        """Connect (McpServerError when the server cannot be reached); cancelling this stops connecting. Every
        request goes to a URL `allow` allows (None: an operator's --tool-server)."""
        session = cls(url, headers, limits, allow)
        connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session._task = asyncio.create_task(session._hold(connected), name=f"MCP session {shown(url)}")
        try:
            await connected
        except BaseException:
            await session.close()
            raise
        return session

    async def _hold(self, connected: asyncio.Future[None]) -> None:
        """The session's task: connect, report to `connected`, wait for `close`, close."""
        try:
            async with AsyncExitStack() as stack:
                self._client, self.transport = await connect(stack, self.url, self._headers, self._limits,
                                                             self._scrub, self._allow)
                connected.set_result(None)
                await self._closing.wait()
        except McpServerError as exc:
            if not connected.done():
                connected.set_exception(exc)
        except BaseException as exc:
            if not connected.done():
                connected.set_exception(McpServerError(
                    f"Could not connect to the MCP server at {shown(self.url)}: {describe(exc, self._scrub)}"))
            if not isinstance(exc, Exception):  # cancellation (close gave up waiting), or the process stopping
                raise
            logger.debug("MCP session with %s ended: %s", shown(self.url), describe(exc, self._scrub))

    @property
    def connected(self) -> bool:
        return self._client is not None and self._task is not None and not self._task.done()

    @property
    def server_name(self) -> str | None:
        info = self._client.server_info if self.connected and self._client is not None else None
        return info.name if info is not None else None

    @property
    def instructions(self) -> str | None:
        return self._client.instructions if self.connected and self._client is not None else None

    def request_close(self) -> None:
        """Ask the session's task to close it (it does so even if nobody waits)."""
        self._closing.set()

    async def close(self) -> None:
        """End the session; waits at most CLOSE_TIMEOUT for it to close cleanly, then cancels it."""
        self.request_close()
        task = self._task
        if task is None or task.done():
            return
        if self._client is None:  # still connecting: there is nothing to close cleanly
            task.cancel()
        await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)

    async def list_tools(self) -> ServerTools:
        """Every tool the server lists (following pages, up to `max_pages`), in its order, first of a name kept."""
        tools: dict[str, McpTool] = {}
        cursor: str | None = None
        try:
            async with asyncio.timeout(self._limits.list_timeout):
                for _ in range(self._limits.max_pages):
                    page = await self._live_client().list_tools(cursor=cursor)
                    for tool in page.tools:
                        tools.setdefault(tool.name, McpTool.from_mcp(tool))
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the client is told why, safely
            raise McpServerError(f"Could not list the tools of the MCP server at {shown(self.url)}: "
                                 f"{describe(exc, self._scrub)}") from None
        return ServerTools(self.server_name, self.instructions, tuple(tools.values()))

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout: float | None = None) -> ToolOutput:
        """Call a tool; a failure of any kind is a failed ToolOutput, a timeout cancels the call on the server.
        The output never quotes the client's header values (a server may echo them: they would be stored)."""
        limit = self._limits.call_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                result = await self._live_client().call_tool(name, arguments)
        except TimeoutError:
            return ToolOutput(f"The call to {name} timed out after {limit:g} seconds and was cancelled.", failed=True)
        except Exception as exc:  # noqa: BLE001 - a failed call is a result the model is told about
            return capped(f"The call to {name} failed: {describe(exc, self._scrub)}", self._limits.max_output_chars,
                          failed=True)
        return from_result(result, self._limits.max_output_chars, self._scrub)

    async def call_tool_json(self, name: str, arguments: str, timeout: float | None = None) -> ToolOutput:
        """`call_tool` with the arguments as the model wrote them: JSON text of an object (empty text: `{}`)."""
        parsed = parse_arguments(arguments)
        if parsed is None:
            return ToolOutput(f"The arguments for {name} must be a JSON object; nothing was called.", failed=True)
        return await self.call_tool(name, parsed, timeout)

    def _live_client(self) -> Client:
        if not self.connected or self._client is None:
            raise ConnectionError(f"the connection to the MCP server at {shown(self.url)} is closed")
        return self._client


def parse_arguments(text: str) -> dict[str, Any] | None:
    """A JSON object's text as a dict; `{}` for blank text; None for anything else (model output: never raises)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
