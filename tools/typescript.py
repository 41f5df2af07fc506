"""Function tools as gpt-oss reads them: JSON Schema to the TypeScript-like declarations of the developer message.

The base is a port of openai-harmony's `json_schema_to_typescript` and `template_tools_section` (src/encoding.rs,
v0.0.8): for every schema the library renders without losing information the text is the same, character for
character (tests/test_tool_declarations.py compares them on generated schemas), quirks included, since the
model was trained on that renderer's output. Where the library loses information we write it, each time in a
form the library itself uses for the nearest case:

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

import json
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

# Past these, `$ref`s are no longer expanded (they render as `any`): a small schema whose references fan out
# must not turn into megabytes of text. The budget counts schemas written inside expansions (a schema's own
# nodes are free: they are bounded by its size); depth counts nested schemas.
_EXPANSION_BUDGET = 1_000
_MAX_DEPTH = 64
_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1


def tools_section(declarations: Sequence[str]) -> str:
    """`# Tools` with the `functions` namespace holding these declarations (each from `declaration`)."""
    return ("# Tools\n\n## functions\n\nnamespace functions {\n\n" + "\n".join(declarations)
            + "\n} // namespace functions")


def namespace_section(name: str, description: str | None, declarations: Sequence[str]) -> str:
    """`## {name}`, the description as `//` lines, then the namespace holding the declarations (each from
    `declaration`), as openai-harmony writes a `ToolNamespaceConfig` (src/encoding.rs, `template_tools_section`)."""
    lines = rust_lines(description) if description else []
    if not declarations:  # the library writes a namespace without tools as its description alone
        return "\n".join([f"## {name}\n", *lines])
    head = "".join(f"// {line}\n" for line in lines)
    return f"## {name}\n\n{head}namespace {name} {{\n\n" + "\n".join(declarations) + f"\n}} // namespace {name}"


def declaration(name: str, description: str, parameters: Any) -> str:
    """One function: its description as `//` lines, then `type NAME = (_: ARGS) => any;` and a line break."""
    comments = "".join(f"// {line}\n" for line in rust_lines(description))
    if parameters is None:
        return f"{comments}type {name} = () => any;\n"
    return f"{comments}type {name} = (_: {schema_to_typescript(parameters)}) => any;\n"


def schema_to_typescript(schema: Any) -> str:
    return _Converter(schema).type_of(schema, "", 0)


def rust_lines(text: str) -> list[str]:
    """Rust's `str::lines`: split at "\\n", drop one "\\r" before it, no empty last line."""
    *ended, last = text.split("\n")
    lines = [line.removesuffix("\r") for line in ended]
    return [*lines, last] if last else lines


def json_text(value: Any) -> str:
    """`value` as serde_json writes it: compact, non-ASCII kept, floats in ryu's shortest form."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value) if _I64_MIN <= value <= _U64_MAX else _float_text(float(value))
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json_text(str(key))}:{json_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(json_text, value)) + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _float_text(value: float) -> str:
    """ryu's `format_finite`: the same shortest digits as Python's repr, laid out its own way."""
    if not math.isfinite(value):
        return "null"  # what serde_json writes for them
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    stripped = digits.rstrip("0")
    k = int(exponent or 0) - len(fraction) + len(digits) - len(stripped)  # value = stripped * 10**k
    digits, length = stripped, len(stripped)
    kk = length + k  # 10**(kk-1) <= value < 10**kk
    if 0 <= k and kk <= 16:
        return f"{sign}{digits}{'0' * k}.0"
    if 0 < kk <= 16:
        return f"{sign}{digits[:kk]}.{digits[kk:]}"
    if -5 < kk <= 0:
        return f"{sign}0.{'0' * -kk}{digits}"
    if length == 1:
        return f"{sign}{digits}e{kk - 1}"
    return f"{sign}{digits[0]}.{digits[1:]}e{kk - 1}"


def _literal(value: Any) -> str:
    # The library writes string enum values between quotes, unescaped; other values as JSON.
    return f'"{value}"' if isinstance(value, str) else json_text(value)


def _is_enum(schema: dict[str, Any]) -> bool:
    enum = schema.get("enum")
    return isinstance(enum, list) and bool(enum)


def _default_comment(schema: dict[str, Any]) -> str | None:
    """`default: ...` as the library writes it for a property: strings quoted raw, but bare for an enum."""
    if "default" not in schema:
        return None
    default = schema["default"]
    if isinstance(default, str):
        return f'default: {default}' if _is_enum(schema) else f'default: "{default}"'
    return f"default: {json_text(default)}"


def _comment_lines(indent: str, text: str) -> str:
    if "\n" not in text:
        return f"{indent}// {text}\n"  # the library's form, exactly
    return "".join(f"{indent}// {line}\n" for line in rust_lines(text))


class _Converter:
    """One schema's conversion: the root (for `$ref`), the references being expanded, the expansion budget."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.expanding: list[str] = ["#"]  # the root is being written: a reference to it is a cycle
        self.budget = _EXPANSION_BUDGET

    # -- resolving `$ref` and `allOf` ----------------------------------------------------------------------

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
            expand = isinstance(ref, str) and depth < _MAX_DEPTH and self.budget > 0 and ref not in self.expanding
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
            for member in all_of if isinstance(all_of, list) and depth < _MAX_DEPTH else []:
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
        schema, nullable = self.collapse(schema)
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

    # -- unions ---------------------------------------------------------------------------------------------

    @staticmethod
    def variants(schema: dict[str, Any]) -> list[Any] | None:
        """The members of a union written in the library's `oneOf` form: `oneOf`, else an `anyOf` that the
        library would have written as `any` (no usable `type`)."""
        one_of = schema.get("oneOf")
        if one_of is not None:
            return one_of if isinstance(one_of, list) else None
        any_of = schema.get("anyOf")
        if isinstance(any_of, list) and any_of and not _shape_known(schema):
            return any_of
        return None

    def collapse(self, schema: Any) -> tuple[Any, bool]:
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

    # -- the conversion -------------------------------------------------------------------------------------

    def type_of(self, schema: Any, indent: str, depth: int) -> str:
        self.spend()
        if depth > _MAX_DEPTH or not isinstance(schema, dict):
            return "any"
        schema, nullable, entered = self.prepare(schema)
        try:
            text = self._type_of(schema, indent, depth)
            return f"{text} | null" if nullable else text
        finally:
            self.leave(entered)

    def _type_of(self, schema: dict[str, Any], indent: str, depth: int) -> str:
        variants = self.variants(schema)
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
                    comments.append(f'default: "{default}"' if isinstance(default, str) and not _is_enum(variant)
                                    else f"default: {json_text(default)}")
            if comments:
                out += f" // {' '.join(comments)}"
        return out

    def item_type(self, items: Any, indent: str, depth: int) -> str:
        """An array's item type; a union in parentheses, so that `[]` applies to all of it."""
        self.spend()
        if depth + 1 > _MAX_DEPTH or not isinstance(items, dict):
            return "any"
        items, nullable, entered = self.prepare(items)
        try:
            members = self.inline_members(items, indent, depth + 1)
            if members is None:
                members = [self._type_of(items, indent, depth + 1)]
            if (nullable or items.get("nullable") is True) and "null" not in members:
                members.append("null")
            return members[0] if len(members) == 1 else f"({' | '.join(members)})"
        finally:
            self.leave(entered)

    def inline_members(self, schema: dict[str, Any], indent: str, depth: int) -> list[str] | None:
        """The members of a union written on one line, or None when the schema is not a union."""
        variants = self.variants(schema)
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
        if depth + 1 > _MAX_DEPTH or not isinstance(value, dict):
            return f"{indent}{key}{mark}: any,\n"
        value, forced_null, entered = self.prepare(value)
        try:
            variants = self.variants(value)
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
            self.leave(entered)

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


def _shape_known(schema: dict[str, Any]) -> bool:
    """Whether the schema says what it is without its `anyOf` (which then only adds constraints)."""
    kind = schema.get("type")
    return (isinstance(kind, str) or (isinstance(kind, list) and any(isinstance(name, str) for name in kind))
            or isinstance(schema.get("properties"), dict) or "items" in schema or _is_enum(schema) or "const" in schema)


def _is_null(schema: Any) -> bool:
    return (isinstance(schema, dict) and schema.get("type") == "null"
            and len(schema.keys() - {"title", "description"}) == 1)


def _literals(schema: dict[str, Any]) -> list[str] | None:
    """The values of an `enum` or `const` as literal types; None when the schema has neither."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return [_literal(value) for value in enum]
    if "const" in schema:
        return [_literal(schema["const"])]
    return None


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
