"""gpt-oss's built-in `browser` and `python` tools, run by MCP servers the operator names (`--tool-server URL`).

openai/gpt-oss ships such servers (gpt-oss-mcp-server/browser_server.py and python_server.py, FastMCP servers
named `browser` and `python`), and vLLM's `--tool-server` looks servers up by that name. A server's name is
optional in newer MCP versions, so a server is recognized by its tools: the browser is a server listing `search`,
`open` and `find` (the three functions of openai-harmony's `ToolNamespaceConfig.browser()`, all of which the
model is shown), python a server listing a tool `python`, or a server named `python` with a single tool. The
code goes in the tool's `code` argument (gpt-oss's server), else its first required string argument. Where
several servers provide a tool, the first in the order of the flags serves it.

Servers are listed lazily: the first response that needs them (or `start`) lists all of them at once; one that
cannot be reached is tried again, at most every `retry_seconds`, by the next response that asks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.server_tools.connect import McpServerError
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.listing import McpTool, ServerTools
from proxy.server_tools.sessions import McpSessions

logger = logging.getLogger("harmony_proxy")

BROWSER = "browser"
PYTHON = "python"
BROWSER_FUNCTIONS = ("search", "open", "find")


@dataclass(frozen=True)
class BuiltinTool:
    """A built-in tool and the server that runs it: `functions` are the server's tool names it calls."""

    name: str  # BROWSER or PYTHON: the Harmony namespace the model calls (`browser.search`, `python`)
    url: str
    functions: tuple[str, ...]
    code_argument: str = "code"  # python: the argument the model's code is passed in

    def server_tool(self, recipient: str) -> str | None:
        """The server's tool for a recipient the model wrote (`browser.open` -> `open`, `python` -> the python
        tool); None when this tool has no such function."""
        if self.name == PYTHON:
            return self.functions[0] if recipient == PYTHON else None
        namespace, _, function = recipient.partition(".")
        return function if namespace == BROWSER and function in self.functions else None


def recognize(url: str, listed: ServerTools) -> list[BuiltinTool]:
    """The built-in tools a listed server provides (see the module's docstring for the rules)."""
    names = {tool.name for tool in listed.tools}
    found = []
    if set(BROWSER_FUNCTIONS) <= names:
        found.append(BuiltinTool(BROWSER, url, BROWSER_FUNCTIONS))
    python = listed.get(PYTHON)
    if python is None and (listed.server_name or "").lower() == PYTHON and len(listed.tools) == 1:
        python = listed.tools[0]
    if python is not None:
        found.append(BuiltinTool(PYTHON, url, (python.name,), _code_argument(python)))
    return found


def _code_argument(tool: McpTool) -> str:
    properties = tool.input_schema.get("properties")
    if not isinstance(properties, dict) or "code" in properties:
        return "code"
    required = tool.input_schema.get("required")
    for name in required if isinstance(required, list) else []:
        if isinstance(properties.get(name), dict) and properties[name].get("type") == "string":
            return name
    return next(iter(properties), "code")


class ToolServers:
    """The `--tool-server` URLs and the built-in tools they turned out to provide; owned by the app state."""

    def __init__(self, urls: Sequence[str] = (), limits: McpLimits | None = None, retry_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.urls = tuple(urls)
        self._limits = limits or McpLimits()
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._listed: dict[str, ServerTools] = {}
        self._failed_at: dict[str, float] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """List every server now (at start-up), so the first response does not wait, and log what they offer."""
        await self.builtin_tools()

    async def builtin_tools(self) -> dict[str, BuiltinTool]:
        """The built-in tools available now, by name (`browser`, `python`)."""
        if len(self._listed) < len(self.urls):
            async with self._lock:
                now = self._clock()
                due = [url for url in self.urls if url not in self._listed
                       and now - self._failed_at.get(url, -math.inf) >= self._retry_seconds]
                await asyncio.gather(*(self._list(url) for url in due))
        tools: dict[str, BuiltinTool] = {}
        for url in self.urls:
            for tool in recognize(url, self._listed[url]) if url in self._listed else []:
                tools.setdefault(tool.name, tool)
        return tools

    async def _list(self, url: str) -> None:
        try:
            async with McpSessions(self._limits) as sessions:
                listed = await (await sessions.get(url)).list_tools()
        except McpServerError as exc:
            self._failed_at[url] = self._clock()
            logger.warning("tool server %s: %s (tried again in %gs at the earliest)", url, exc, self._retry_seconds)
            return
        self._listed[url] = listed
        provided = [tool.name for tool in recognize(url, listed)]
        logger.info("tool server %s (%s): %s", url, listed.server_name or "unnamed",
                    ", ".join(provided) if provided else "provides neither the browser nor the python tool")
