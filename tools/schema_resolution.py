"""What a JSON Schema node stands for, before tools/typescript_types.py writes it: `$ref` inlined, `allOf` merged,
and its union recognised (a `oneOf`, an `anyOf` the library would write as `any`, pydantic's `Optional[X]`).

References are expanded within bounds (`References`): a small schema whose references fan out must not turn
into megabytes of text, and a cyclic reference stays `any`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

# Past these, `$ref`s are no longer expanded (they render as `any`). The budget counts schemas written inside
# expansions (a schema's own nodes are free: they are bounded by its size); depth counts nested schemas.
_EXPANSION_BUDGET = 1_000
MAX_DEPTH = 64


class References:
    """One schema's references: the root they point into, those being expanded, the expansion budget."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.expanding: list[str] = ["#"]  # the root is being written: a reference to it is a cycle
        self.budget = _EXPANSION_BUDGET

    def resolve(self, schema: Any, depth: int = 0) -> tuple[Any, int]:
        """The schema with a `$ref` inlined and `allOf` merged; how many references it entered (to `leave`).

        A reference in a cycle, past the budget, nested too deep, or not found renders as the referring schema's
        own keywords, usually `any`."""
        if not isinstance(schema, dict):
            return schema, 0
        entered = 0
        ref = schema.get("$ref")
        if ref is not None:
            schema = {key: value for key, value in schema.items() if key != "$ref"}
            expand = isinstance(ref, str) and depth < MAX_DEPTH and self.budget > 0 and ref not in self.expanding
            target = self._target(ref) if expand else None
            if isinstance(target, dict):
                self.budget -= 1
                self.expanding.append(ref)
                target, entered = self.resolve(target, depth + 1)
                entered += 1
                schema = {**target, **schema} if isinstance(target, dict) else schema
        all_of = schema.get("allOf")
        if all_of is not None:
            merged: dict[str, Any] = {}
            for member in all_of if isinstance(all_of, list) and depth < MAX_DEPTH else []:
                member, more = self.resolve(member, depth + 1)
                entered += more
                if isinstance(member, dict):
                    _merge_into(merged, member)
            _merge_into(merged, {key: value for key, value in schema.items() if key != "allOf"}, override=True)
            schema = merged
        return schema, entered

    def prepare(self, schema: dict[str, Any]) -> tuple[dict[str, Any], bool, int]:
        """`resolve`, then `collapse` (resolving again what the collapse brought up, such as an `Optional` model)."""
        schema, entered = self.resolve(schema)
        schema, nullable = collapse(schema)
        if nullable:
            schema, more = self.resolve(schema)
            entered += more
        return schema, nullable, entered

    def spend(self) -> None:
        if len(self.expanding) > 1:  # inside a reference: the root "#" is always there
            self.budget -= 1

    def leave(self, entered: int) -> None:
        del self.expanding[len(self.expanding) - entered :]

    def _target(self, ref: str) -> Any:
        """What a reference within the document (`#` or `#/json/pointer`) points at; None for anything else."""
        if ref != "#" and not ref.startswith("#/"):
            return None  # another document, or an `$anchor`
        node = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node


def union_members(schema: dict[str, Any]) -> list[Any] | None:
    """The members of a union written in the library's `oneOf` form: `oneOf`, else an `anyOf` that the
    library would have written as `any` (no usable `type`)."""
    one_of = schema.get("oneOf")
    if one_of is not None:
        return one_of if isinstance(one_of, list) else None
    any_of = schema.get("anyOf")
    if isinstance(any_of, list) and any_of and not _shape_known(schema):
        return any_of
    return None


def collapse(schema: Any) -> tuple[Any, bool]:
    """`anyOf: [X, {type: null}]` as X plus "is nullable", the rest of the schema over X."""
    if not isinstance(schema, dict) or "oneOf" in schema or _shape_known(schema):
        return schema, False
    any_of = schema.get("anyOf")
    if not isinstance(any_of, list) or len(any_of) < 2:
        return schema, False
    nulls = [member for member in any_of if _is_null(member)]
    others = [member for member in any_of if not _is_null(member)]
    if not nulls or len(others) != 1 or not isinstance(others[0], dict):
        return schema, False
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**others[0], **rest}, True


def is_enum(schema: dict[str, Any]) -> bool:
    enum = schema.get("enum")
    return isinstance(enum, list) and bool(enum)


def _shape_known(schema: dict[str, Any]) -> bool:
    """Whether the schema says what it is without its `anyOf` (which then only adds constraints)."""
    kind = schema.get("type")
    return (isinstance(kind, str) or (isinstance(kind, list) and any(isinstance(name, str) for name in kind))
            or isinstance(schema.get("properties"), dict) or "items" in schema or is_enum(schema) or "const" in schema)


def _is_null(schema: Any) -> bool:
    return (isinstance(schema, dict) and schema.get("type") == "null"
            and len(schema.keys() - {"title", "description"}) == 1)


def _merge_into(merged: dict[str, Any], schema: dict[str, Any], override: bool = False) -> None:
    """`allOf`: properties and `required` add up; another keyword keeps its first value (the outer schema's own
    keywords win over its members')."""
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        elif key == "required" and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = merged[key] + [name for name in value if name not in merged[key]]
        elif override or key not in merged:
            merged[key] = value
