"""The tools a Harmony prompt declares, read back from its developer message.

The mock engine calls tools as a model does, from what its prompt declares. In front of clients the output
constraint also hands it the tools, JSON Schemas and all; behind an upstream (another harmony-proxy's raw
`/v1/completions`) only the prompt carries them. So the mock reads the declarations that `tools/typescript.py` and
`tools/freeform.py` write: each namespace, each tool's name, and each argument's type, as a JSON Schema of the same
shape (required fields, types, string literals, arrays, nested objects), from which it makes example arguments
as it does in front. What the TypeScript form does not keep (formats, bounds, patterns) is not recovered.
"""

from __future__ import annotations

import re
from typing import Any

from tools.definitions import FunctionTool
from tools.freeform import Freeform

_NAMESPACE = re.compile(r"^namespace (\S+) \{\n(.*?)^\} // namespace \1$", re.MULTILINE | re.DOTALL)
_DECLARATION = re.compile(r"^type (\S+) = \((.*?)\) => any;$", re.MULTILINE | re.DOTALL)
_FIELD = re.compile(r"^(\w+)(\?)?: (.*)$")
_LITERAL = re.compile(r'^(?:"[^"]*"|-?\d+(?:\.\d+)?|true|false|null)$')
_PRIMITIVES = {"string": {"type": "string"}, "number": {"type": "number"}, "boolean": {"type": "boolean"},
               "null": {"type": "null"}, "any": {}}


def declared_tools(developer: str) -> tuple[FunctionTool, ...]:
    """Every tool the `# Tools` section of a developer message declares, in order."""
    tools = []
    for namespace in _NAMESPACE.finditer(developer.partition("# Tools")[2]):
        name = namespace.group(1)
        for found in _DECLARATION.finditer(namespace.group(2)):
            arguments = found.group(2).strip()
            tools.append(FunctionTool(
                found.group(1),
                parameters=_parameters(arguments),
                namespace=None if name == "functions" else name,
                freeform=Freeform() if arguments == "_: string" else None,
            ))
    return tuple(tools)


def _parameters(arguments: str) -> dict[str, Any] | None:
    if not arguments.startswith("_: {"):
        return None
    lines = [line.strip() for line in arguments.splitlines()[1:]]
    return _object(lines, 0)[0]


def _object(lines: list[str], at: int) -> tuple[dict[str, Any], int]:
    """The object whose fields start at lines[at], and the line after its closing brace."""
    properties: dict[str, Any] = {}
    required = []
    while at < len(lines):
        line = lines[at]
        at += 1
        if line.startswith("}"):
            break
        field = _FIELD.match(line)
        if field is None:  # a comment line
            continue
        name, optional, kind = field.groups()
        kind = re.sub(r",?( // .*)?$", "", kind)
        if kind == "{":
            properties[name], at = _object(lines, at)
        else:
            properties[name] = _schema(kind)
        if not optional:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}, at


def _schema(kind: str) -> dict[str, Any]:
    """A JSON Schema for one TypeScript type as tools/typescript.py writes it."""
    kind = kind.strip()
    if kind.endswith("[]"):
        item = kind[:-2]
        return {"type": "array", "items": _schema(item[1:-1] if item.startswith("(") else item)}
    if kind.startswith("Record<string, ") and kind.endswith(">"):
        return {"type": "object", "additionalProperties": _schema(kind[len("Record<string, "):-1])}
    parts = [part.strip() for part in kind.split(" | ")]
    if len(parts) > 1 and all(_LITERAL.match(part) for part in parts):
        return {"enum": [_literal(part) for part in parts]}
    if len(parts) > 1:
        return {"anyOf": [_schema(part) for part in parts]}
    if _LITERAL.match(kind) and kind not in ("null",):
        return {"const": _literal(kind)}
    return dict(_PRIMITIVES.get(kind, {}))


def _literal(text: str) -> Any:
    if text.startswith('"'):
        return text[1:-1]
    return {"true": True, "false": False, "null": None}.get(text, float(text) if "." in text else int(text))
