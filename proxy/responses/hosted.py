"""The server-side tools of one response, resolved: which MCP servers it may reach and what they offer, which of
gpt-oss's built-in tools a `--tool-server` runs for it, how they are declared to the model, and what a call the
model writes is a call to.

`resolve` runs before the response starts: a `server_url` outside `--mcp-allow` is a 400 naming the rule, and a
server whose tools cannot be listed a 424 (as OpenAI answers). A built-in tool no tool server provides is not offered
(`offered_builtins`, logged). Listing
goes through the app's tool-list cache (`proxy/server_tools/tool_cache.py`), so the turns of an agent list a
server once; a server listed earlier in the conversation (an `mcp_list_tools` item in its history or input) is
not listed again as an output item, as OpenAI does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from proxy.errors import APIError, invalid_request
from proxy.responses.request.hosted_request import HostedRequest, McpRequest
from proxy.server_tools.allow import McpAllowList, McpUrlRefused
from proxy.server_tools.builtin import BROWSER, BuiltinTool, ToolServers
from proxy.server_tools.connect import McpServerError
from proxy.server_tools.headers import ServerHeaders
from proxy.server_tools.listing import McpTool
from proxy.server_tools.rendering import function_tool
from proxy.server_tools.sessions import McpSessions
from proxy.server_tools.tool_cache import ToolListCache
from proxy.validation import parse_off_loop
from tools import typescript
from tools.definitions import ToolError
from tools.typescript import namespace_section

logger = logging.getLogger("harmony_proxy")

MCP, APPROVAL, WEB_SEARCH, CODE = "mcp", "approval", "web_search", "code_interpreter"


@dataclass(frozen=True)
class McpServer:
    label: str
    url: str  # normalized, allowed
    headers: ServerHeaders
    request: McpRequest
    tools: dict[str, McpTool]  # the allowed tools the server lists, that can be offered, by name


@dataclass(frozen=True)
class CallTarget:
    """What a call the model wrote is: `kind` MCP (run it), APPROVAL (ask the client first), WEB_SEARCH or CODE
    (a built-in tool). `tool` is the server's tool to call, None when the recipient names no offered tool."""

    kind: str
    recipient: str
    channel: str
    name: str  # as the output item names it: the MCP tool, the browser function, "python"
    server: McpServer | None = None
    builtin: BuiltinTool | None = None
    tool: str | None = None

    @property
    def server_label(self) -> str:
        return self.server.label if self.server is not None else self.recipient.partition(".")[0]


@dataclass
class HostedTools:
    servers: dict[str, McpServer] = field(default_factory=dict)
    builtin: dict[str, BuiltinTool] = field(default_factory=dict)
    namespaces: dict[str, str] = field(default_factory=dict)  # label -> its developer-message section
    listed: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)  # mcp_list_tools items to emit
    container_id: str = "auto"
    include_outputs: bool = False  # code_interpreter_call.outputs was asked for

    @property
    def recipients(self) -> frozenset[str]:
        """The namespaces the model may address: MCP labels and the built-in tools offered."""
        return frozenset(self.servers) | frozenset(self.builtin)

    def target(self, recipient: str, channel: str | None) -> CallTarget:
        """What a call the model addressed to `recipient` (an offered namespace) is."""
        namespace, _, name = recipient.partition(".")
        channel = channel or "commentary"
        server = self.servers.get(namespace)
        if server is not None:
            tool = server.tools.get(name)
            approval = tool is not None and server.request.approval.required(tool)
            return CallTarget(APPROVAL if approval else MCP, recipient, channel, name, server,
                              tool=tool.name if tool is not None else None)
        builtin = self.builtin.get(namespace)
        kind = WEB_SEARCH if namespace == BROWSER else CODE
        server_tool = builtin.server_tool(recipient) if builtin is not None else None
        return CallTarget(kind, recipient, channel, name or namespace, builtin=builtin, tool=server_tool)

    def offer_none(self) -> None:
        """`tool_choice: none`: the servers are listed (and shown so), but no tool is offered to the model."""
        self.servers.clear()
        self.builtin.clear()
        self.namespaces.clear()

    def mcp_target(self, label: str, name: str) -> CallTarget:
        """An MCP call the client approved: it runs, whatever the approval policy says."""
        target = self.target(f"{label}.{name}", "commentary")
        return CallTarget(MCP, target.recipient, target.channel, name, target.server, tool=target.tool)


async def resolve(
    request: HostedRequest, allow: McpAllowList, tool_servers: ToolServers, cache: ToolListCache,
    sessions: McpSessions, earlier_items: Iterable[dict[str, Any]], include: Iterable[str],
) -> HostedTools:
    """Check and list the request's server-side tools (400 and 424 as the module says)."""
    urls = [_allowed(allow, server) for server in request.mcp]
    hosted = HostedTools(container_id=request.container_id,
                         include_outputs="code_interpreter_call.outputs" in include)
    if request.builtin:
        available = await tool_servers.builtin_tools()
        hosted.builtin.update((name, available[name]) for name in request.builtin if name in available)
    listings = await asyncio.gather(*(_list(server, url, cache, sessions) for server, url in zip(request.mcp, urls)),
                                    return_exceptions=True)
    already = {item.get("server_label") for item in earlier_items
               if item.get("type") == "mcp_list_tools" and not item.get("error")}
    for server, url, listing in zip(request.mcp, urls, listings):
        if isinstance(listing, BaseException):
            if isinstance(listing, McpServerError):
                raise APIError(424, f"Error retrieving tool list from MCP server {server.label!r}: {listing}",
                               param=f"{server.param}.server_url", code="mcp_list_tools_failed")
            raise listing
        tools, description = listing
        offered = await parse_off_loop(partial(_offerable, server.label, tools), large=False)  # schemas checked
        hosted.servers[server.label] = McpServer(server.label, url, server.headers, server,
                                                 {tool.name: tool for tool in offered})
        hosted.namespaces[server.label] = namespace_section(server.label, server.description or description,
                                                            list(offered.values()))
        if server.label not in already:
            hosted.listed.append((server.label, [tool.as_openai() for tool in offered]))
    return hosted


async def offered_builtins(request: HostedRequest, tool_servers: ToolServers) -> HostedRequest:
    """The request with only the built-in tools a `--tool-server` runs now; the others are listed back in the
    response but not offered to the model (logged, naming the tool type the request used)."""
    if not request.builtin:
        return request
    available = frozenset(await tool_servers.builtin_tools())
    for name, position in request.builtin.items():
        if name not in available:
            logger.info("tools[%d] (%r): not offered to the model: %s", position, request.kinds[position],
                        _no_tool_server(name, tool_servers))
    return request.offering(available)


def _allowed(allow: McpAllowList, server: McpRequest) -> str:
    try:
        return allow.check(server.url)
    except McpUrlRefused as exc:
        raise invalid_request(str(exc), param=f"{server.param}.server_url", code="mcp_server_not_allowed") from None


def _no_tool_server(name: str, tool_servers: ToolServers) -> str:
    if not tool_servers.urls:
        return (f"gpt-oss's {name} tool runs here only through an MCP tool server: start the server with "
                f"--tool-server URL (a server providing the {name} tool)")
    return f"no --tool-server provides gpt-oss's {name} tool now (the servers may be unreachable: see the log above)"


async def _list(server: McpRequest, url: str, cache: ToolListCache,
                sessions: McpSessions) -> tuple[list[McpTool], str | None]:
    names = server.allowed.names if server.allowed is not None else None
    listed, _ = await cache.list_tools(sessions, url, server.headers, names)
    tools = [tool for tool in listed.tools if server.allowed is None or server.allowed.matches(tool)]
    return tools, listed.instructions


def _offerable(label: str, tools: list[McpTool]) -> dict[McpTool, str]:
    """The tools whose names and schemas can be offered to the model, with their declarations; the others are
    left out (an MCP server is trusted no more than a client), and logged."""
    offered = {}
    for tool in tools:
        try:
            checked = function_tool(tool)
        except ToolError as exc:
            logger.warning("MCP server %s: tool left out: %s", label, exc)
            continue
        offered[tool] = typescript.declaration(checked.name, checked.description, checked.parameters)
    return offered
