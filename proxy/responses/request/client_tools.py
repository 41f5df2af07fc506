"""The client's own tools in a Responses request, read and checked: functions, custom (freeform) tools, and namespace
tools (functions and custom tools grouped under a name of their own: Codex declares each MCP server it runs, and its
sub-agent tools, so), from `tools` and from `additional_tools` input items. A custom tool is a `FunctionTool` with a
`freeform` format (tools/freeform.py).

Harmony has namespaces natively: the `functions` namespace holds the functions declared outside any namespace, and
each namespace tool is declared as a namespace of its own in the developer message (`namespace mcp__docs__ {...}`),
which the model addresses as `to=mcp__docs__.search`. Calls come back as `function_call` items naming the member
(`name`) and its namespace (`namespace`), the pair Codex routes by.

The tools of `additional_tools` items (Codex >= 0.150 sends tools so) are offered with the request's own, declared
up front: a tool declared again with the same content counts once. Server-side tools there (`mcp`,
`code_interpreter`, `web_search`) are not offered: declare them in `tools`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import invalid_request
from proxy.responses.request.schema import (
    CUSTOM_TOOL,
    FUNCTION_TOOL,
    NAMESPACE_TOOL,
    REFUSED_TOOLS,
    TOOL_SEARCH_NOTE,
    TOOL_SEARCH_TOOL,
)
from proxy.validation import check, compile_schema, type_name
from tools.cache import ToolCatalog
from tools.definitions import FunctionTool, ToolError, check_unique, declaration_key, namespace_error
from tools.freeform import Freeform

logger = logging.getLogger("harmony_proxy")

_FUNCTION = compile_schema(FUNCTION_TOOL)
_NAMESPACE = compile_schema(NAMESPACE_TOOL)
_CUSTOM = compile_schema(CUSTOM_TOOL)
_TOOL_SEARCH = compile_schema(TOOL_SEARCH_TOOL)
CLIENT_TOOL_TYPES = frozenset({"function", "custom", "namespace", "tool_search"})
# Tool types an additional_tools item may hold but that are not offered from there (logged).
_NOT_OFFERED_THERE = frozenset({"mcp", "code_interpreter", "web_search", "web_search_2025_08_26", "web_search_preview",
                                "web_search_preview_2025_03_11"})


@dataclass
class ClientTools:
    tools: list[FunctionTool] = field(default_factory=list)  # functions, namespace members with their namespace
    namespaces: dict[str, str] = field(default_factory=dict)  # the namespace tools: name -> description
    echo: list[dict[str, Any]] = field(default_factory=list)  # the request's `tools` as the response lists them


@dataclass
class _Reading:
    declarations: list[tuple[Any, ...]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    namespaces: dict[str, str] = field(default_factory=dict)
    seen: set[str] | None = None  # with additional_tools: the declarations read, as JSON (one read again counts once)


def read_client_tools(tools: list[Any], items: list[dict[str, Any]], catalog: ToolCatalog) -> ClientTools:
    """The checked tools of `tools` (server-side ones already taken out) and of the input's additional_tools items;
    a 400 naming the field for anything wrong."""
    reading = _Reading()
    echo = [_read(tool, f"tools[{position}]", reading) for position, tool in enumerate(tools)]
    for position, item in enumerate(items):
        if item["type"] != "additional_tools":
            continue
        if reading.seen is None:
            reading.seen = {declaration_key(*declaration) for declaration in reading.declarations}
        for index, tool in enumerate(item["tools"]):
            where = f"input[{position}].tools[{index}]"
            kind = type_name(tool, f"{where}.type")
            if kind in _NOT_OFFERED_THERE:
                logger.info("%s (%r): not offered to the model: declare server-side tools in `tools`", where, kind)
                continue
            _check_kind(kind, f"{where}.type")
            _read(tool, where, reading)
    try:
        declared = catalog.read(reading.declarations, reading.paths.__getitem__)
        check_unique(declared, reading.paths.__getitem__)
    except ToolError as exc:
        raise invalid_request(str(exc), param=exc.param, code=exc.code) from None
    return ClientTools(declared, reading.namespaces, echo)


def _freeform(value: dict[str, Any] | None) -> Freeform:
    if value is None or value["type"] == "text":
        return Freeform()
    return Freeform(value["syntax"], value["definition"])


def _check_kind(kind: str | None, param: str) -> None:
    if kind not in CLIENT_TOOL_TYPES:
        reason = REFUSED_TOOLS.get(kind) if kind is not None else None
        reason = reason or "declare function, custom or namespace tools"
        raise invalid_request(f"Tool type {kind!r} is not supported: {reason}.",
                              param=param, code="invalid_value")


def _read(tool: dict[str, Any], where: str, reading: _Reading) -> dict[str, Any]:
    """Add one tool's declarations; its echo."""
    if tool["type"] == "tool_search":  # nothing to declare: every tool is (schema.py)
        check(tool, _TOOL_SEARCH, where)
        return {"type": "tool_search", "execution": tool.get("execution") or "server",
                "description": tool.get("description") or TOOL_SEARCH_NOTE, "parameters": tool.get("parameters")}
    if tool["type"] != "namespace":
        return _function(tool, where, None, reading)
    check(tool, _NAMESPACE, where)
    name = tool["name"]
    problem = namespace_error(name)
    if problem is not None:
        raise invalid_request(problem, param=f"{where}.name")
    if tool["tools"] or tool.get("description"):  # an empty namespace without a description says nothing
        reading.namespaces.setdefault(name, tool.get("description") or "")
    members = []
    for index, member in enumerate(tool["tools"]):
        if member.get("type") not in ("function", "custom"):
            raise invalid_request(f"Tool type {member.get('type')!r} is not supported in a namespace: declare "
                                  "function or custom tools.", param=f"{where}.tools[{index}].type",
                                  code="invalid_value")
        members.append(_function(member, f"{where}.tools[{index}]", name, reading))
    return {"type": "namespace", "name": name, "description": tool.get("description"), "tools": members}


def _function(tool: dict[str, Any], where: str, namespace: str | None, reading: _Reading) -> dict[str, Any]:
    """A function or a custom tool."""
    custom = tool["type"] == "custom"
    check(tool, _CUSTOM if custom else _FUNCTION, where)
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in callers:
        raise invalid_request("Programmatic tool calling is not offered: the model calls functions directly; allow "
                              "'direct'.", param=f"{where}.allowed_callers", code="unsupported_parameter")
    if tool.get("async") is True:
        raise invalid_request("Asynchronous tool calls are not supported: in Harmony a call ends the model's turn "
                              "(`<|call|>`), and the model goes on only when the output follows the call; it cannot "
                              "keep working while a call runs.", param=f"{where}.async", code="unsupported_parameter")
    freeform = _freeform(tool.get("format")) if custom else None
    declaration = (tool["name"], tool.get("description"), tool.get("parameters"), tool.get("strict"), namespace,
                   freeform)
    if reading.seen is not None:
        key = declaration_key(*declaration)
        if key in reading.seen:
            return {}
        reading.seen.add(key)
    reading.declarations.append(declaration)
    reading.paths.append(where)
    if custom:
        return {"type": "custom", "name": tool["name"], "description": tool.get("description"),
                "format": tool.get("format") or {"type": "text"}}
    return {"type": "function", "name": tool["name"], "description": tool.get("description") or None,
            "parameters": tool.get("parameters"), "strict": tool.get("strict")}
