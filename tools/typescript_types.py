"""JSON Schema as the TypeScript-like types of gpt-oss's tool declarations (tools/typescript.py writes the rest).

A port of openai-harmony's `json_schema_to_typescript` (src/encoding.rs, v0.0.8): for every schema the library
renders without losing information the text is the same, character for character (tests/test_tool_declarations.py
compares them on generated schemas), quirks included, since the model was trained on that renderer's output. Where
the library loses information we write it, each time in a form the library itself uses for the nearest case:

- `anyOf` (the library writes `any`): written as the library writes `oneOf`; `anyOf: [X, {type: null}]` (how
  pydantic spells `Optional[X]`) as X with `| null` appended, the library's form for `nullable: true`;
- `type: "null"` (library: `any`): `null`, as the library spells it inside a type list;
- `enum` of non-strings, or on a type other than string, and `const` (library: the bare type, or `any`): the
  literal union the library writes for string enums (`"a" | 1 | null`, strings unescaped as the library does);
- `object` and `array` inside a type list (library: the bare words): rendered as the single types are;
- a union as array items (library: `"a" | "b"[]`, which reads as `"a" | ("b"[])`): `("a" | "b")[]`, and a
  `nullable` item type keeps its `| null`;
- `$ref` to `#/...` and `allOf` (library: `any`): the target inlined, with the referring schema's own keywords
  over it; a cyclic reference stays `any`;
- an object with an `additionalProperties` schema and no `properties` (library: `{ }`): `Record<string, T>`;
- `properties` or `items` without `type` (library: `any`): an object or an array;
- a description or title with line breaks (library: one `//` for the first line only): `//` on every line, as
  the library writes tool descriptions; examples that are not strings (library: dropped) as JSON.
"""

from __future__ import annotations

from typing import Any

from tools.rust_text import json_text, rust_lines
from tools.schema_resolution import MAX_DEPTH, References, is_enum, union_members


def schema_to_typescript(schema: Any) -> str:
    return _Converter(schema).type_of(schema, "", 0)


def _literal(value: Any) -> str:
    # The library writes string enum values between quotes, unescaped; other values as JSON.
    return f'"{value}"' if isinstance(value, str) else json_text(value)


def _default_comment(schema: dict[str, Any]) -> str | None:
    """`default: ...` as the library writes it for a property: strings quoted raw, but bare for an enum."""
    if "default" not in schema:
        return None
    default = schema["default"]
    if isinstance(default, str):
        return f'default: {default}' if is_enum(schema) else f'default: "{default}"'
    return f"default: {json_text(default)}"


def _comment_lines(indent: str, text: str) -> str:
    if "\n" not in text:
        return f"{indent}// {text}\n"  # the library's form, exactly
    return "".join(f"{indent}// {line}\n" for line in rust_lines(text))


class _Converter:
    """One schema's conversion: the root's references (tools/schema_resolution.py), then the text."""

    def __init__(self, root: Any) -> None:
        self.references = References(root)

    def type_of(self, schema: Any, indent: str, depth: int) -> str:
        self.references.spend()
        if depth > MAX_DEPTH or not isinstance(schema, dict):
            return "any"
        schema, nullable, entered = self.references.prepare(schema)
        try:
            text = self._type_of(schema, indent, depth)
            return f"{text} | null" if nullable else text
        finally:
            self.references.leave(entered)

    def _type_of(self, schema: dict[str, Any], indent: str, depth: int) -> str:
        variants = union_members(schema)
        if variants is not None:
            return self.top_level_union(variants, indent, depth)
        literals = _literals(schema)
        if literals is not None:
            return " | ".join(literals)
        kind = schema.get("type")
        if isinstance(kind, list):
            names = [name for name in kind if isinstance(name, str)]
            if names:
                return " | ".join(self.single_type(schema, name, indent, depth, in_list=True) for name in names)
            kind = None
        if not isinstance(kind, str):
            kind = "object" if isinstance(schema.get("properties"), dict) else "array" if "items" in schema else None
        return self.single_type(schema, kind, indent, depth) if kind is not None else "any"

    def single_type(self, schema: dict[str, Any], kind: str, indent: str, depth: int, in_list: bool = False) -> str:
        if kind == "object":
            return self.object_type(schema, indent, depth)
        if kind == "array":
            if "items" not in schema:
                return "Array<any>"
            return self.item_type(schema["items"], indent, depth) + "[]"
        if kind == "null":
            return "null"
        if kind in ("number", "integer"):
            return "number"
        if kind in ("string", "boolean"):
            return kind
        return kind if in_list else "any"  # the library writes unknown names in a list as they are

    def top_level_union(self, variants: list[Any], indent: str, depth: int) -> str:
        """The library's `oneOf` outside a property: each member on a line of its own after ` | `."""
        out = ""
        for variant in variants:
            out += f"\n{indent} | "
            text = self.type_of(variant, f"{indent}   ", depth + 1)
            if isinstance(variant, dict) and variant.get("nullable") is True and "null" not in text:
                text += " | null"
            out += text
            comments = []
            if isinstance(variant, dict):
                if isinstance(variant.get("description"), str):
                    comments.append(variant["description"])
                if "default" in variant:
                    default = variant["default"]
                    comments.append(f'default: "{default}"' if isinstance(default, str) and not is_enum(variant)
                                    else f"default: {json_text(default)}")
            if comments:
                out += f" // {' '.join(comments)}"
        return out

    def item_type(self, items: Any, indent: str, depth: int) -> str:
        """An array's item type; a union in parentheses, so that `[]` applies to all of it."""
        self.references.spend()
        if depth + 1 > MAX_DEPTH or not isinstance(items, dict):
            return "any"
        items, nullable, entered = self.references.prepare(items)
        try:
            members = self.inline_members(items, indent, depth + 1)
            if members is None:
                members = [self._type_of(items, indent, depth + 1)]
            if (nullable or items.get("nullable") is True) and "null" not in members:
                members.append("null")
            return members[0] if len(members) == 1 else f"({' | '.join(members)})"
        finally:
            self.references.leave(entered)

    def inline_members(self, schema: dict[str, Any], indent: str, depth: int) -> list[str] | None:
        """The members of a union written on one line, or None when the schema is not a union."""
        variants = union_members(schema)
        if variants is not None:
            members = []
            for variant in variants:
                text = self.type_of(variant, indent, depth + 1)
                members.append(f"({text})" if text.startswith("\n") else text)
                if isinstance(variant, dict) and variant.get("nullable") is True and "null" not in text:
                    members.append("null")
            return members
        literals = _literals(schema)
        if literals is not None:
            return literals
        kind = schema.get("type")
        if isinstance(kind, list) and any(isinstance(name, str) for name in kind):
            return [self.single_type(schema, name, indent, depth, in_list=True)
                    for name in kind if isinstance(name, str)]
        return None

    def object_type(self, schema: dict[str, Any], indent: str, depth: int) -> str:
        out = _comment_lines(indent, schema["description"]) if isinstance(schema.get("description"), str) else ""
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if not isinstance(properties, dict) and isinstance(extra, dict) and extra:
            members = self.inline_members_of(extra, indent, depth)
            return f"{out}Record<string, {members}>"
        out += "{\n"
        if isinstance(properties, dict):
            required = schema.get("required")
            required_names = ({name for name in required if isinstance(name, str)} if isinstance(required, list)
                              else set())
            for key, value in properties.items():
                out += self.property(key, value, key in required_names, indent, depth)
        return f"{out}{indent}}}"

    def inline_members_of(self, schema: Any, indent: str, depth: int) -> str:
        text = self.item_type(schema, indent, depth)
        return text[1:-1] if text.startswith("(") and text.endswith(")") else text

    def property(self, key: str, value: Any, required: bool, indent: str, depth: int) -> str:
        mark = "" if required else "?"
        if depth + 1 > MAX_DEPTH or not isinstance(value, dict):
            return f"{indent}{key}{mark}: any,\n"
        value, forced_null, entered = self.references.prepare(value)
        try:
            variants = union_members(value)
            out = ""
            if isinstance(value.get("title"), str):
                out += _comment_lines(indent, value["title"]) + f"{indent}//\n"
            description = value.get("description") if isinstance(value.get("description"), str) else None
            if variants is None and description is not None:
                out += _comment_lines(indent, description)
            examples = value.get("examples")
            if isinstance(examples, list) and examples:
                out += f"{indent}// Examples:\n"
                for example in examples:
                    out += f'{indent}// - "{example}"\n' if isinstance(example, str) else \
                        f"{indent}// - {json_text(example)}\n"
            if variants is not None:
                return out + self.property_union(key, mark, value, variants, description, indent, depth)
            text = self.type_of(value, f"{indent}    ", depth + 1)
            if forced_null or (value.get("nullable") is True and "null" not in text):
                text += " | null"
            default = _default_comment(value)
            return f"{out}{indent}{key}{mark}: {text},{f' // {default}' if default else ''}\n"
        finally:
            self.references.leave(entered)

    def property_union(self, key: str, mark: str, value: dict[str, Any], variants: list[Any],
                       description: str | None, indent: str, depth: int) -> str:
        """The library's `oneOf` property: comments above the name, then one ` | ` line per member."""
        first = variants[0] if variants and isinstance(variants[0], dict) else {}
        above = description is not None and description != first.get("description")
        out = _comment_lines(indent, description) if above and description is not None else ""
        default = _default_comment(value)
        if default:
            out += f"{indent}// {default}\n"
        out += f"{indent}{key}{mark}:\n"
        for position, variant in enumerate(variants):
            text = self.type_of(variant, f"{indent}   ", depth + 1)
            comments = []
            if isinstance(variant, dict):
                if variant.get("nullable") is True and "null" not in text:
                    text += " | null"
                own = variant.get("description")
                if not (position == 0 and above) and isinstance(own, str) and own != description:
                    comments.append(own)
                variant_default = _default_comment(variant)
                if variant_default:
                    comments.append(variant_default)
            joined = " ".join(comments)
            out += f"{indent} | {text}{f' // {joined}' if comments else ''}\n"
        return out + f"{indent},\n"


def _literals(schema: dict[str, Any]) -> list[str] | None:
    """The values of an `enum` or `const` as literal types; None when the schema has neither."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return [_literal(value) for value in enum]
    if "const" in schema:
        return [_literal(schema["const"])]
    return None

