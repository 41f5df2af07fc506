"""Is a tool's `parameters` a valid JSON Schema (the 2020-12 meta-schema, checked fast), and can the grammar
engine enforce it?

`jsonschema`'s own check of a small tool schema takes ~0.7 ms (2020-12 assembles its meta-schema from seven
vocabularies with `$dynamicRef`, which its reference resolver walks on every subschema). The same meta-schema with
its vocabularies merged into one object and `$dynamicRef: "#meta"` turned into `$ref: "#"` means the same thing
(no schema extends it here), and compiled by `tools.fast_schema` it accepts a valid schema in microseconds. Anything
it is not sure of goes to `jsonschema`, which has the last word and words the error.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jsonschema
import llguidance
from jsonschema_specifications import REGISTRY

from tools.bounded_cache import BoundedCache
from tools.fast_schema import compile_predicate

logger = logging.getLogger("harmony_proxy.grammar")

_LATEST = jsonschema.Draft202012Validator
_BASE = "https://json-schema.org/draft/2020-12/"
# What the top of the meta-schema and of each vocabulary may hold; anything else would change the meaning.
_VOCABULARY_KEYWORDS = {"$schema", "$id", "$vocabulary", "$dynamicAnchor", "$comment", "title", "type", "allOf",
                        "properties", "$defs"}


def schema_error(parameters: dict[str, Any]) -> str | None:
    """The meta-schema error of a parameters schema, as `jsonschema.check_schema` words it; None when valid."""
    validator = _LATEST
    if isinstance(parameters.get("$schema"), str):  # jsonschema's validator_for fails on any other $schema
        validator = jsonschema.validators.validator_for(parameters, default=_LATEST)
    if validator is _LATEST and _ACCEPTS(parameters):
        return None
    try:
        validator.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        return exc.message
    return None


def merged_meta_schema() -> dict[str, Any]:
    """The 2020-12 meta-schema as one object: vocabularies' properties and $defs side by side, refs local."""
    root = _LATEST.META_SCHEMA
    properties: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    sources = [REGISTRY.contents(_BASE + part["$ref"]) for part in root["allOf"]] + [root]
    for source in sources:
        unexpected = set(source) - _VOCABULARY_KEYWORDS
        if unexpected:
            raise ValueError(f"the meta-schema has keywords this merge does not know: {sorted(unexpected)}")
        for name, subschema in source.get("properties", {}).items():
            if name in properties:
                raise ValueError(f"meta-schema keyword {name!r} is defined twice")
            properties[name] = _local(subschema)
        for name, subschema in source.get("$defs", {}).items():
            if defs.setdefault(name, _local(subschema)) != _local(subschema):
                raise ValueError(f"meta-schema $defs {name!r} differ between vocabularies")
    return {"type": ["object", "boolean"], "properties": properties, "$defs": defs}


def _local(schema: Any) -> Any:
    """References of one vocabulary, rewritten for the merged schema."""
    if isinstance(schema, list):
        return [_local(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in ("properties", "$defs"):
            result[keyword] = {name: _local(sub) for name, sub in value.items()}
        elif keyword == "$dynamicRef":
            if value != "#meta":
                raise ValueError(f"unexpected $dynamicRef {value!r}")
            result["$ref"] = "#"
        elif keyword == "$ref":
            result["$ref"] = "#/$defs/" + value.rsplit("/$defs/", 1)[1]  # "#/$defs/x" or "meta/core#/$defs/x"
        else:
            result[keyword] = _local(value)
    return result


# Built once at import from constants of the jsonschema packages; immutable afterwards.
_ACCEPTS = compile_predicate(merged_meta_schema(), _LATEST.FORMAT_CHECKER)


# JSON whitespace the model may write at one place (pretty-printed JSON); a bound, so a constrained model cannot
# spin in whitespace until max_tokens, the classic failure of unbounded JSON whitespace.
JSON_WHITESPACE = "[\\x20\\x0A\\x0D\\x09]{1,32}"


def grammar_options(strict: bool) -> dict[str, Any]:
    """llguidance's `x-guidance` options for a schema: unsupported keywords ignored (lenient) unless strict."""
    return {"whitespace_pattern": JSON_WHITESPACE, "lenient": not strict}


# llguidance.LLParserLimits for every grammar a client sends: regex analysis while the lexer is built (~50k a ms;
# its default 1M), per-mask lexer work (~14k a ms; 200k), lexer states (1 to 2 kB each; 250k) and grammar symbols
# (500k). Past them a grammar is refused, rather than seconds of work and unbounded memory.
LLGUIDANCE_LIMITS = {"initial_lexer_fuel": 200_000, "step_lexer_fuel": 50_000, "max_lexer_states": 20_000,
                     "max_grammar_size": 200_000}


@dataclass(frozen=True)
class Enforcement:
    """How far the grammar engine (llguidance) enforces a schema."""

    error: str | None  # why it cannot compile the schema at all (strict: a 400; otherwise: any JSON object)
    relaxed: tuple[str, ...]  # what it leaves unenforced or approximates (its own words)


class UncheckedSchema(Exception):
    """Raised, inside `checked_later()`, for a schema llguidance has not checked yet: the request's parser
    (`proxy.validation.parse_off_loop`) parses on the event loop under it, and on this exception parses again in a
    worker thread, where the schema is checked and remembered. llguidance then never runs on the event loop."""


# Each distinct (schema, strict) checked once per process: agents resend the same tools every turn.
_CHECKED: BoundedCache[tuple[str, bool], Enforcement] = BoundedCache(4096, 64 * 1024 * 1024)
_LATER: contextvars.ContextVar[bool] = contextvars.ContextVar("schemas_checked_later", default=False)


@contextmanager
def checked_later() -> Iterator[None]:
    """Within it, a schema not checked yet raises UncheckedSchema instead of being checked here."""
    token = _LATER.set(True)
    try:
        yield
    finally:
        _LATER.reset(token)


def enforcement(schema: dict[str, Any], strict: bool) -> Enforcement:
    """llguidance's verdict on a schema (0.1 ms to ~1 s within tools.schema_bounds); a relaxed schema is logged the
    first time it is seen. Inside `checked_later()`, an unchecked schema raises UncheckedSchema."""
    schema_json = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    known = _CHECKED.get((schema_json, strict))
    if known is not None:
        return known
    if _LATER.get():
        raise UncheckedSchema()
    result = _check(schema_json, strict)
    _CHECKED.put((schema_json, strict), result, len(schema_json))
    return result


def _check(schema_json: str, strict: bool) -> Enforcement:
    schema = {**json.loads(schema_json), "x-guidance": grammar_options(strict)}
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, limits=llguidance.LLParserLimits(**LLGUIDANCE_LIMITS))
    except ValueError as exc:
        failed, messages = True, [str(exc)]
    messages = [" ".join(message.split()) for message in messages]  # regex errors span lines
    result = Enforcement(messages[0] if failed and messages else None, () if failed else tuple(messages))
    if not strict and (result.error or result.relaxed):
        logger.warning("a schema is not fully enforced (%s): %s", "held to any JSON object" if result.error else
                       "relaxed", result.error or "; ".join(result.relaxed))
    return result


def unresolved_ref(schema: dict[str, Any]) -> str | None:
    """The first `$ref` that points to nothing inside the schema; only local references (`#...`) resolve here."""
    anchors = set()
    stack: list[Any] = [schema]
    refs: list[str] = []
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack += node
        elif isinstance(node, dict):
            for keyword, value in node.items():
                if keyword == "$ref" and isinstance(value, str):
                    refs.append(value)
                elif keyword == "$anchor" and isinstance(value, str):
                    anchors.add(value)
                elif keyword not in ("const", "enum", "default", "examples"):  # values there are data, not schemas
                    stack.append(value)
    for ref in refs:
        if not _resolves(schema, ref, anchors):
            return ref
    return None


def _resolves(schema: dict[str, Any], ref: str, anchors: set[str]) -> bool:
    if not ref.startswith("#"):
        return False
    if ref == "#":
        return True
    if not ref.startswith("#/"):
        return ref[1:] in anchors
    node: Any = schema
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return isinstance(node, (dict, bool))
