"""Example arguments for a function tool: a small value that validates against its JSON Schema.

The mock engine calls tools with these, so a client's tool loop gets arguments it can really parse.
"""

from __future__ import annotations

from typing import Any

import jsonschema

_MAX_DEPTH = 8
# A schema may ask for more (minLength: 10**9); the example stays small, and is then not valid.
_MAX_ITEMS = 16
_MAX_LENGTH = 256
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "mock@example.com",
    "uri": "https://example.com",
    "url": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def example_arguments(schema: dict[str, Any] | None) -> Any:
    """Arguments valid against `schema` where we can find some: all properties first, then required only."""
    if not schema:
        return {}
    for optional in (True, False):
        value = _Example(schema, optional).value(schema, "value", 0)
        try:
            if jsonschema.validators.validator_for(schema)(schema).is_valid(value):
                return value
        except Exception:  # noqa: BLE001, S110  # unresolvable or endlessly recursive $refs: keep the best attempt
            pass
    return value


class _Example:
    def __init__(self, root: dict[str, Any], optional: bool) -> None:
        self._root = root
        self._optional = optional  # include properties that are not required

    def value(self, schema: Any, name: str, depth: int) -> Any:
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return None
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), name, depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        if "default" in schema:
            return schema["default"]
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self.value(schema[key][0], name, depth + 1)
        if schema.get("allOf"):
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                part_value = self.value(part, name, depth + 1)
                if isinstance(part_value, dict):
                    merged.update(part_value)
            return merged
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "string"
        return self._typed(kind, schema, name, depth)

    def _typed(self, kind: str, schema: dict[str, Any], name: str, depth: int) -> Any:
        if kind == "object":
            required = set(schema.get("required", []))
            properties = schema.get("properties", {})
            return {
                key: self.value(sub, key, depth + 1)
                for key, sub in properties.items()
                if self._optional or key in required
            }
        if kind == "array":
            items = schema.get("items", {})
            count = min(_MAX_ITEMS, max(1, _int(schema.get("minItems"), 1)))
            count = min(count, _int(schema.get("maxItems"), count))
            return [self.value(items, name, depth + 1) for _ in range(count)]
        if kind in ("integer", "number"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return _string(schema, name)

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#/"):
            return {}
        node: Any = self._root
        for part in ref[2:].split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
        return node


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    value: float = 1
    if isinstance(low, (int, float)):
        value = low + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
    elif isinstance(high, (int, float)) and value > high:
        value = high - (1 if "exclusiveMaximum" in schema and "maximum" not in schema else 0)
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0:
        value = -(-value // step) * step
    return int(value) if integer else value


def _string(schema: dict[str, Any], name: str) -> str:
    text = _FORMATS.get(str(schema.get("format", "")), f"mock {name}")
    minimum = min(_MAX_LENGTH, _int(schema.get("minLength"), 0))
    if len(text) < minimum:
        text = text + "x" * (minimum - len(text))
    return text[: _int(schema.get("maxLength"), len(text))]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
