"""The tools of a Responses request that this server runs itself: `{"type": "mcp"}` servers and gpt-oss's built-in
tools (`web_search_preview` / `web_search` for the browser, `code_interpreter` for python), read and checked.

`split_server_tools` takes them out of the body, so the rest of the request is read as before (the client's own
tools only), and checks their shape: a 400 naming the field for anything wrong. A built-in tool the client wants no
live search from (`external_web_access: false`), or that no `--tool-server` runs, is listed back in the response
but not offered to the model. What needs the server's state (the `--mcp-allow` rule, which `--tool-server`s
exist, the servers' tool lists) is checked later, in `hosted.py`.
Header values and the `authorization` token are kept in `ServerHeaders` only: the request's own echo of its
tools (`echo`) has them redacted, so the response object, and so the store, never holds them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.errors import invalid_request
from proxy.server_tools.allow import redacted_url
from proxy.server_tools.headers import REDACTED, HeaderError, ServerHeaders
from proxy.server_tools.listing import McpTool
from proxy.server_tools.rendering import label_error
from proxy.validation import check, compile_schema, type_name

logger = logging.getLogger("harmony_proxy")

BROWSER_TYPES = frozenset({"web_search_preview", "web_search_preview_2025_03_11", "web_search",
                           "web_search_2025_08_26"})
PYTHON_TYPES = frozenset({"code_interpreter"})
SERVER_TOOL_TYPES = BROWSER_TYPES | PYTHON_TYPES | {"mcp"}
MAX_MCP_SERVERS = 16
MAX_SERVER_TOOLS = MAX_MCP_SERVERS + len(SERVER_TOOL_TYPES)  # a list longer than this plus --max-tools is refused

_STRINGS = {"type": "array", "items": {"type": "string"}}
_FILTER = {"type": "object", "properties": {"tool_names": _STRINGS, "read_only": {"type": "boolean"}},
           "additionalProperties": False}
_NULLABLE_STRING = {"type": ["string", "null"]}
_CALLERS = {"type": ["array", "null"], "items": {"enum": ["direct", "programmatic"]}}


def _tool(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["type"], "properties": properties, "additionalProperties": False}


MCP_TOOL = _tool({
    "type": {"const": "mcp"},
    "server_label": {"type": "string"},
    "server_url": {"type": "string"},
    "connector_id": _NULLABLE_STRING,
    "tunnel_id": _NULLABLE_STRING,
    "authorization": _NULLABLE_STRING,
    "headers": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    "allowed_tools": {"anyOf": [{"type": "null"}, _STRINGS, _FILTER]},
    "require_approval": {"anyOf": [{"enum": ["always", "never", None]}, {
        "type": "object", "properties": {"always": _FILTER, "never": _FILTER}, "additionalProperties": False}]},
    "server_description": _NULLABLE_STRING,
    "defer_loading": {"type": ["boolean", "null"]},  # ignored: every tool is declared up front
    "allowed_callers": _CALLERS,
})
# Search options the gpt-oss browser has no use for are accepted and ignored; a domain filter it cannot honour is not.
BROWSER_TOOL = _tool({
    "type": {"enum": sorted(BROWSER_TYPES)},
    "search_context_size": {"enum": ["low", "medium", "high", None]},
    "search_content_types": {"type": ["array", "null"], "items": {"enum": ["text", "image"]}},
    "user_location": {"type": ["object", "null"]},
    "filters": {"type": ["object", "null"]},
    "external_web_access": {"type": ["boolean", "null"]},
})
PYTHON_TOOL = _tool({
    "type": {"const": "code_interpreter"},
    "container": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["type"], "properties": {
        "type": {"const": "auto"}, "file_ids": _STRINGS, "memory_limit": _NULLABLE_STRING,
        "network_policy": {"type": ["object", "null"]}}, "additionalProperties": False}]},
    "allowed_callers": _CALLERS,
})
_MCP, _BROWSER, _PYTHON = compile_schema(MCP_TOOL), compile_schema(BROWSER_TOOL), compile_schema(PYTHON_TOOL)


@dataclass(frozen=True)
class ToolFilter:
    """OpenAI's tool filter: tool names, and/or whether the tool is read-only (MCP's `readOnlyHint`)."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    @classmethod
    def read(cls, value: Any) -> ToolFilter | None:
        if value is None:
            return None
        if isinstance(value, list):
            return cls(frozenset(value))
        names = value.get("tool_names")
        return cls(None if names is None else frozenset(names), value.get("read_only"))

    def matches(self, tool: McpTool) -> bool:
        if self.names is not None and tool.name not in self.names:
            return False
        return self.read_only is None or _read_only(tool) == self.read_only


def _read_only(tool: McpTool) -> bool:
    return bool((tool.annotations or {}).get("readOnlyHint"))


@dataclass(frozen=True)
class ApprovalPolicy:
    """`require_approval`: "always" (OpenAI's default), "never", or filters of the tools that always / never need it.
    A tool that neither filter names needs approval, as with "always"."""

    mode: str = "always"
    always: ToolFilter | None = None
    never: ToolFilter | None = None

    @classmethod
    def read(cls, value: Any) -> ApprovalPolicy:
        if value is None or isinstance(value, str):
            return cls(value or "always")
        return cls("filter", ToolFilter.read(value.get("always")), ToolFilter.read(value.get("never")))

    def required(self, tool: McpTool) -> bool:
        if self.mode != "filter":
            return self.mode == "always"
        if self.always is not None and self.always.matches(tool):
            return True
        return not (self.never is not None and self.never.matches(tool))


@dataclass(frozen=True)
class McpRequest:
    """One `{"type": "mcp"}` tool as the client sent it, checked for shape (`url` not yet against --mcp-allow)."""

    position: int
    label: str
    url: str
    headers: ServerHeaders
    allowed: ToolFilter | None
    approval: ApprovalPolicy
    description: str | None

    @property
    def param(self) -> str:
        return f"tools[{self.position}]"


@dataclass(frozen=True)
class HostedRequest:
    """The server-side tools a request asks for; empty (falsy) for most requests."""

    mcp: tuple[McpRequest, ...] = ()
    builtin: dict[str, int] = field(default_factory=dict)  # "browser" / "python" -> the position that asked
    echo: tuple[dict[str, Any], ...] = ()  # the tools as the response lists them (secrets redacted)
    container_id: str = "auto"  # the code_interpreter container named, reported in its calls
    kinds: dict[int, str] = field(default_factory=dict)  # position -> the tool type as the request wrote it

    def __bool__(self) -> bool:
        return bool(self.mcp or self.builtin)

    def offering(self, available: frozenset[str]) -> HostedRequest:
        """These tools with only the built-in ones in `available` offered (the others are still listed back)."""
        return replace(self, builtin={name: at for name, at in self.builtin.items() if name in available})

    def refuse_constraints(self, body: dict[str, Any]) -> None:
        """Output constraints are enforced by a grammar over the whole completion that knows the client's tools and
        the final answer only: under it the model could never call a server-side tool. Refused rather than ignored,
        naming the tool type the request used."""
        if not self:
            return
        positions = [server.position for server in self.mcp] + list(self.builtin.values())
        kinds = ", ".join(sorted({repr(self.kinds[position]) for position in positions}))
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
            raise invalid_request(f"A JSON `text.format` cannot be combined with server-side tools (here {kinds}): "
                                  "the format is enforced by a grammar that leaves no room for their calls.",
                                  param="text.format", code="unsupported_parameter")
        choice = body.get("tool_choice")
        if choice == "required" or isinstance(choice, dict):
            raise invalid_request(f"With server-side tools (here {kinds}), `tool_choice` may only be 'auto' or 'none': "
                                  "a required call is enforced for the client's own tools only.",
                                  param="tool_choice", code="unsupported_parameter")


def split_server_tools(body: dict[str, Any]) -> tuple[dict[str, Any], HostedRequest]:
    """(the body with only its function tools, the server-side tools); a 400 for a malformed server-side tool."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not any(_kind(tool, at) in SERVER_TOOL_TYPES for at, tool in enumerate(tools)):
        return body, HostedRequest()
    functions, servers, builtin, echo, container, kinds = [], [], {}, [], "auto", {}
    for position, tool in enumerate(tools):
        kind = _kind(tool, position)
        if kind not in SERVER_TOOL_TYPES:
            functions.append(tool)
            continue
        kinds[position] = kind
        if kind == "mcp":
            servers.append(_mcp(tool, position))
            echo.append(_echo(tool))
            continue
        name = "browser" if kind in BROWSER_TYPES else "python"
        check(tool, _BROWSER if name == "browser" else _PYTHON, f"tools[{position}]")
        _refuse_unhonoured_builtin(tool, position)
        echo.append(dict(tool))
        if tool.get("external_web_access") is False:
            # Search without live web access (Codex declares web_search so when it wants none): gpt-oss's browser
            # has only live access, so the tool is listed back but not offered.
            logger.info("tools[%d] (%r, external_web_access: false): not offered to the model", position, kind)
            continue
        builtin.setdefault(name, position)
        container = tool["container"] if isinstance(tool.get("container"), str) else container
    if len(servers) > MAX_MCP_SERVERS:
        raise invalid_request(f"A request may name at most {MAX_MCP_SERVERS} MCP servers.", param="tools")
    labels = [server.label for server in servers]
    for server in servers:
        if labels.count(server.label) > 1:
            raise invalid_request(f"server_label {server.label!r} names two MCP servers; labels must be unique.",
                                  param=f"{server.param}.server_label")
    return {**body, "tools": functions}, HostedRequest(tuple(servers), builtin, tuple(echo), container, kinds)


def _kind(tool: Any, position: int) -> str | None:
    return type_name(tool, f"tools[{position}].type")


def _mcp(tool: dict[str, Any], position: int) -> McpRequest:
    where = f"tools[{position}]"
    check(tool, _MCP, where)
    for name in ("connector_id", "tunnel_id"):
        if tool.get(name) is not None:
            raise invalid_request(f"`{name}` is not supported: name the MCP server by its `server_url`.",
                                  param=f"{where}.{name}", code="unsupported_parameter")
    problem = label_error(tool.get("server_label"))
    if problem is not None:
        raise invalid_request(problem, param=f"{where}.server_label")
    if not tool.get("server_url"):
        raise invalid_request("Missing required parameter: an MCP tool needs a `server_url`.",
                              param=f"{where}.server_url", code="missing_required_parameter")
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in callers:
        raise invalid_request("Programmatic tool calling is not offered: the model calls tools directly; allow "
                              "'direct'.", param=f"{where}.allowed_callers", code="unsupported_parameter")
    return McpRequest(position, tool["server_label"], tool["server_url"], _headers(tool, where),
                      ToolFilter.read(tool.get("allowed_tools")), ApprovalPolicy.read(tool.get("require_approval")),
                      tool.get("server_description"))


def _headers(tool: dict[str, Any], where: str) -> ServerHeaders:
    """`headers`, and `authorization` sent as a bearer token (it may not be given twice)."""
    headers = dict(tool.get("headers") or {})
    token = tool.get("authorization")
    if token is not None:
        if any(name.lower() == "authorization" for name in headers):
            raise invalid_request("Give the token either in `authorization` or as an Authorization header, not both.",
                                  param=f"{where}.authorization")
        headers["Authorization"] = f"Bearer {token}"
    try:
        return ServerHeaders.from_request(headers)
    except HeaderError as exc:
        raise invalid_request(str(exc), param=f"{where}.headers") from None


def _echo(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool as the response lists it: every header value and the token replaced."""
    shown = dict(tool)
    if isinstance(tool.get("headers"), dict):
        shown["headers"] = dict.fromkeys(tool["headers"], REDACTED)
    if tool.get("authorization") is not None:
        shown["authorization"] = REDACTED
    if isinstance(tool.get("server_url"), str):
        shown["server_url"] = redacted_url(tool["server_url"])  # a token in its query is a secret too
    return shown


def _refuse_unhonoured_builtin(tool: dict[str, Any], position: int) -> None:
    where = f"tools[{position}]"
    domains = (tool.get("filters") or {}).get("allowed_domains")
    if domains:
        raise invalid_request("Domain filters are not supported: gpt-oss's browser tool searches where its tool "
                              "server does.", param=f"{where}.filters.allowed_domains", code="unsupported_parameter")
    container = tool.get("container")
    if isinstance(container, dict) and container.get("file_ids"):
        raise invalid_request("Files cannot be uploaded to the python tool's container here.",
                              param=f"{where}.container.file_ids", code="unsupported_parameter")
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in callers:
        raise invalid_request("Programmatic tool calling is not offered: allow 'direct'.",
                              param=f"{where}.allowed_callers", code="unsupported_parameter")
