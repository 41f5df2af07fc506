"""Function tools and the output format a request declares, checked once so nothing later has to doubt them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tools.freeform import Freeform, format_error
from tools.long_runs import has_long_run
from tools.schema_bounds import schema_bounds_error
from tools.schema_check import enforcement, schema_error, unresolved_ref

# OpenAI allows letters, digits, '_' and '-'; gpt-oss tool names with dots round-trip too (vLLM #51977).
# Whitespace cannot: the name is written into the Harmony recipient `to=functions.NAME`.
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
# A namespace is the first part of a recipient `to=NS.NAME`: no dots.
_NAMESPACE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
# Namespaces the model already knows, or words that are Harmony roles: a client's or MCP server's namespace must not be
# named so (`functions` holds the tools declared outside any namespace).
RESERVED_NAMESPACES = frozenset({"functions", "browser", "python", "container", "multi_tool_use", "assistant",
                                 "user", "system", "developer", "tool", "all"})
# Declarations of bounded depth: the renderer and the grammar compiler recurse over the schema.
MAX_SCHEMA_DEPTH = 48


@dataclass(frozen=True)
class ResponseFormat:
    """A structured-output format: described to the model in the developer message, enforced by the engine.

    `kind` is "json_schema" or "json_object" (any JSON object; its name and schema are ours, not the client's);
    `strict` asks that every keyword of the schema be enforced, or the request refused.
    """

    name: str
    schema: dict[str, Any]
    description: str = ""
    strict: bool = False
    kind: str = "json_schema"
    compiles: bool = True  # the grammar engine compiles the schema (leniently unless strict); else any JSON object


class ToolError(ValueError):
    """A tool declaration or tool_choice the server cannot accept; `param` names the offending field."""

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None  # a JSON Schema; None when the function takes no arguments
    strict: bool | None = None
    namespace: str | None = None  # a client's namespace tool it belongs to; None: the `functions` namespace
    freeform: Freeform | None = None  # a custom tool: raw text input in this format, not JSON arguments
    compiles: bool = True  # the grammar engine compiles `parameters` (leniently unless strict); else any JSON object

    @cached_property
    def key(self) -> str:
        """The declaration as canonical JSON: what caches of per-tool work are keyed by."""
        return declaration_key(self.name, self.description, self.parameters, self.strict, self.namespace,
                               self.freeform)

    @property
    def recipient(self) -> str:
        """How the model addresses it: `functions.NAME`, or `NS.NAME` in a namespace."""
        return f"{self.namespace or 'functions'}.{self.name}"


def declaration_key(name: Any, description: Any, parameters: Any, strict: Any, namespace: Any = None,
                    freeform: Freeform | None = None) -> str:
    """Equal for declarations that make equal tools; key order kept (the rendered declaration follows it)."""
    fields = [name, description or "", parameters, strict]
    if namespace is not None or freeform is not None:
        fields.append(namespace)
    if freeform is not None:
        fields += [freeform.syntax, freeform.definition]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def namespace_error(name: Any) -> str | None:
    """Why `name` cannot name a tool namespace (a client's or an MCP server's), or None when it can."""
    if not isinstance(name, str) or not _NAMESPACE.fullmatch(name):
        return f"Invalid namespace name {name!r}: use 1 to 64 letters, digits, '_' or '-'."
    if name.lower() in RESERVED_NAMESPACES:
        return f"The namespace name {name!r} is reserved: it names a Harmony role or one of gpt-oss's own namespaces."
    return None


@dataclass(frozen=True)
class ToolChoice:
    """`auto`, `none`, `required`, or `function` with the one function the model must call."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forces_call(self) -> bool:
        return self.mode in ("required", "function", "custom")

    @property
    def names_tool(self) -> bool:
        """`function` or `custom`: the one tool `name` must be called."""
        return self.mode in ("function", "custom")


def make_tool(name: Any, description: Any, parameters: Any, strict: Any, param: str,
              namespace: str | None = None, freeform: Freeform | None = None) -> FunctionTool:
    """Check one function declaration; `param` is its path in the request, for error messages; `namespace` (checked
    by the caller, `namespace_error`) the client's namespace tool it belongs to; `freeform` a custom tool's input
    format (its grammar checked here)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolError(
            f"Invalid function name {name!r}: use 1 to 128 letters, digits, '_', '-' or '.'", f"{param}.name"
        )
    if description is not None and not isinstance(description, str):
        raise ToolError("The function description must be a string.", f"{param}.description")
    if description and has_long_run(description):
        raise ToolError("The function description has a run of over 1,000 characters without a break.",
                        f"{param}.description")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise ToolError("The function parameters must be a JSON Schema object.", f"{param}.parameters")
        if json_depth(parameters) > MAX_SCHEMA_DEPTH:
            raise ToolError(f"The parameters schema is nested more than {MAX_SCHEMA_DEPTH} levels deep.",
                            f"{param}.parameters")
        too_large = schema_bounds_error(parameters)
        if too_large is not None:
            raise ToolError(f"The parameters schema of function {name!r} is too large: {too_large}.",
                            f"{param}.parameters")
        if has_long_run(json.dumps(parameters, ensure_ascii=False)):
            raise ToolError("The parameters schema has a run of over 1,000 characters without a break.",
                            f"{param}.parameters")
        error = schema_error(parameters)
        if error is not None:
            raise ToolError(f"Invalid JSON Schema for function {name!r}: {error}", f"{param}.parameters")
    if strict is not None and not isinstance(strict, bool):
        raise ToolError("`strict` must be a boolean.", f"{param}.strict")
    compiles = True
    if parameters is not None:
        problem = enforceability_error(parameters, strict is True)
        if problem is not None:
            raise ToolError(f"Invalid schema for function {name!r}: {problem}", f"{param}.parameters")
        compiles = enforcement(parameters, strict is True).error is None
    if freeform is not None and freeform.constrained:
        if has_long_run(freeform.definition):
            raise ToolError("The grammar has a run of over 1,000 characters without a break.",
                            f"{param}.format.definition")
        problem = format_error(freeform.syntax, freeform.definition)
        if problem is not None:
            raise ToolError(f"Invalid format for custom tool {name!r}: {problem}.", f"{param}.format.definition")
    return FunctionTool(name, description or "", parameters, strict, namespace, freeform, compiles)


def enforceability_error(schema: dict[str, Any], strict: bool) -> str | None:
    """Why a schema cannot be accepted: a `$ref` to nothing, or, with `strict`, what the grammar engine cannot
    enforce (named in its words: the keyword, the regex feature, the format)."""
    ref = unresolved_ref(schema)
    if ref is not None:
        return f"the reference {ref!r} resolves to nothing (only references inside the schema, like '#/$defs/x')."
    if strict:
        error = enforcement(schema, strict=True).error
        if error is not None:
            return f"`strict` is true, but this schema cannot be enforced: {error}. Remove it, or set `strict: false`."
    return None


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in a JSON value (iterative: a hostile value must not exhaust the stack).

    Level by level, with list comprehensions: this runs on every request body."""
    depth, level = 0, [value] if isinstance(value, (dict, list)) else []
    while level:
        depth += 1
        children = []
        for container in level:
            values = container.values() if isinstance(container, dict) else container
            children += [child for child in values if isinstance(child, (dict, list))]
        level = children
    return depth


def check_unique(tools: Sequence[FunctionTool], param: str | Callable[[int], str]) -> None:
    """No two tools of one name in one namespace; `param`: the tools' path, or each tool's by position."""
    seen: set[str] = set()
    for position, tool in enumerate(tools):
        if tool.recipient in seen:
            where = f" in namespace {tool.namespace!r}" if tool.namespace else ""
            path = param(position) if callable(param) else f"{param}[{position}]"
            raise ToolError(f"Function {tool.name!r} is declared twice{where}.", f"{path}.name")
        seen.add(tool.recipient)


def check_choice(choice: ToolChoice, tools: Sequence[FunctionTool], param: str) -> None:
    if choice.mode == "required" and not tools:
        raise ToolError("tool_choice 'required' needs at least one tool in `tools`.", param)
    if choice.mode == "function" and choice.name not in {tool.name for tool in tools if tool.freeform is None}:
        raise ToolError(f"tool_choice names function {choice.name!r}, which is not in `tools`.", param)
    if choice.mode == "custom" and choice.name not in {tool.name for tool in tools if tool.freeform is not None}:
        raise ToolError(f"tool_choice names custom tool {choice.name!r}, which is not in `tools`.", param)
