"""The Harmony text the tool loop adds to a prompt: MCP tools as a namespace, calls, and results.

- An MCP server's tools are declared in the developer message's `# Tools` section as a namespace of their own,
  `namespace {label} { ... } // namespace {label}`, written as openai-harmony writes a `ToolNamespaceConfig`
  (src/encoding.rs, `template_tools_section`) with the declarations of tools/typescript.py. The library writes
  the namespaces of one message in name order (a BTreeMap), `functions` among them; so does `tools_section`.
  Schemas are first trimmed as vLLM (`trim_schema`) and gpt-oss (build-system-prompt.py) trim MCP schemas:
  the `title` keywords SDKs generate and `default: null` go (harmony would write each title as a comment).
- The model calls them as it calls functions, `<|channel|>commentary to={label}.{tool} <|constrain|>json`, and
  the result comes back from the tool, `<|start|>{label}.{tool} to=assistant<|channel|>commentary<|message|>`.
- Built-in tools answer the same way on the channel of the call (gpt-oss's `Tool.process` keeps it):
  `<|start|>browser.search to=assistant<|channel|>analysis<|message|>...`, and `python` for the python tool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from parsers.message_tokens import encode_in_pieces
from parsers.vocab import Vocab
from proxy.server_tools.listing import McpTool
from tools import typescript
from tools.definitions import MAX_SCHEMA_DEPTH, RESERVED_NAMESPACES, FunctionTool, ToolError, json_depth, make_tool

_PIECE_CHARS = 8192
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")  # what a recipient `to=label.NAME` can carry
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "contains", "if", "then", "else")


def label_error(label: object) -> str | None:
    """Why `label` cannot name an MCP server's namespace, or None when it can."""
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        return "server_label must be 1 to 64 letters, digits, '_' or '-'."
    if label.lower() in RESERVED_NAMESPACES:
        return f"server_label {label!r} is reserved: it names a Harmony role or one of gpt-oss's own namespaces."
    return None


def function_tool(tool: McpTool, param: str = "tools") -> FunctionTool:
    """The MCP tool as a checked function of its namespace, schema trimmed; ToolError when it cannot be offered
    (a name no recipient can carry, a schema too deep or invalid: an MCP server is no more trusted than a client)."""
    if not _TOOL_NAME.fullmatch(tool.name):
        raise ToolError(f"The MCP tool name {tool.name[:128]!r} cannot be called: use letters, digits, '_', '-', '.'.",
                        param)
    if json_depth(tool.input_schema) > MAX_SCHEMA_DEPTH:
        raise ToolError(f"The input schema of MCP tool {tool.name!r} is nested more than {MAX_SCHEMA_DEPTH} deep.",
                        param)
    return make_tool(tool.name, tool.description, harmony_schema(tool.input_schema), None, param)


def harmony_schema(schema: Any) -> Any:
    """The schema without `title` keywords and null defaults, at every level (property names are kept)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" or (key == "default" and value is None):
            continue
        if key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [harmony_schema(item) for item in value]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: harmony_schema(item) for name, item in value.items()}
        elif key in _SCHEMA_VALUES:
            out[key] = harmony_schema(value)
        else:
            out[key] = value
    return out


def functions_section(declarations: Sequence[str]) -> str:
    """The client's functions as the `functions` namespace (declarations from `typescript.declaration`)."""
    return typescript.tools_section(declarations).removeprefix("# Tools\n\n")


def tools_section(namespaces: Mapping[str, str]) -> str:
    """The developer message's `# Tools` section: namespace sections by name, in the library's (name) order."""
    return "# Tools\n\n" + "\n\n".join(namespaces[name] for name in sorted(namespaces))


def result_tokens(vocab: Vocab, recipient: str, channel: str, output: str) -> list[int]:
    """A tool's answer to the assistant: `<|start|>{recipient} to=assistant<|channel|>{channel}<|message|>
    {output}<|end|>`, the author being the call's recipient (`weather.get_forecast`, `browser.search`, `python`)
    and the channel the call's (openai-harmony's form, token for token; output text never becomes a special)."""
    special = vocab.special
    return [special.start, *vocab.encode(f"{recipient} to=assistant"), special.channel, *vocab.encode(channel),
            special.message, *encode_in_pieces(vocab, output, _PIECE_CHARS), special.end]


def call_tokens(vocab: Vocab, recipient: str, channel: str, body: str, content_type: str | None = "json") -> list[int]:
    """A call as the model writes it: `<|start|>assistant<|channel|>{channel} to={recipient} <|constrain|>json
    <|message|>{body}<|call|>` (JSON arguments), or ` code` (the python tool's code) in place of the constraint."""
    special = vocab.special
    header = [special.start, *vocab.encode("assistant"), special.channel]
    if content_type == "json":
        header += [*vocab.encode(f"{channel} to={recipient} "), special.constrain, *vocab.encode("json")]
    else:
        header += vocab.encode(f"{channel} to={recipient}" + (f" {content_type}" if content_type else ""))
    return [*header, special.message, *encode_in_pieces(vocab, body, _PIECE_CHARS), special.call]
