"""Request bodies: read as JSON, checked against a JSON Schema, every failure a 400 naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import jsonschema
from jsonschema.exceptions import ValidationError
from starlette.requests import Request

from proxy.errors import APIError, invalid_request
from proxy.schema_errors import QUOTE_CHARS, ErrorFinder, first_error, quote
from tools.cache import ToolCatalog
from tools.definitions import ToolError, json_depth
from tools.fast_schema import Predicate, compile_predicate
from tools.schema_check import UncheckedSchema, checked_later

T = TypeVar("T")

# A gpt-oss context (131,072 tokens) holds well under 8 MiB of text.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_JSON_DEPTH = 64
# Arrays and objects in one body, counted by their opening brackets (in text too, so a bound and not a count):
# millions of them hold the GIL for a long time however they are decoded (the garbage collector walks every
# one, more than once, while they are built). A context of 131,072 tokens holds far fewer.
MAX_JSON_CONTAINERS = 200_000
# OpenAI's limits on `metadata`: 16 pairs, keys of at most 64 characters, string values of at most 512.
METADATA: dict[str, Any] = {"type": ["object", "null"], "maxProperties": 16, "propertyNames": {"maxLength": 64},
                            "additionalProperties": {"type": "string", "maxLength": 512}}
# From this size on, decoding and checking a body takes over ~1 ms: it runs in a worker thread, where the GIL
# passes back to the event loop every few milliseconds (a hop there and back costs ~0.1 ms).
LARGE_BODY_BYTES = 256 * 1024


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object: size checked as it arrives; no NaN, lone surrogates or absurd nesting."""
    return await read_and_parse(request, _same)


async def read_and_parse(request: Request, parse: Callable[[dict[str, Any]], T]) -> T:
    """`parse` of the body read as a JSON object; both in a worker thread when the body is large, or when it holds
    a schema not checked before."""
    body = await _read_body(request)
    large = len(body) >= LARGE_BODY_BYTES
    return await parse_off_loop(lambda: parse(decode_json_object(body, yielding=large)), large)


async def parse_off_loop(parse: Callable[[], T], large: bool) -> T:
    """`parse()`, on the event loop when the work is small, else in a worker thread. Work is small when the input
    is, and every JSON Schema in it has been checked by the grammar engine before: llguidance never runs on the
    event loop (a new schema takes up to a second within tools/schema_bounds.py), so a parse that meets a new one
    stops there (UncheckedSchema) and runs again in a worker thread, where the schema is checked and remembered."""
    if not large:
        try:
            with checked_later():
                return parse()
        except UncheckedSchema:
            pass
    return await asyncio.to_thread(parse)


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json_object(body: bytes, yielding: bool = False) -> dict[str, Any]:
    """The JSON object of a body, or a 400. `yielding`: build objects in Python, so that a worker thread decoding
    a large body lets the event loop take the GIL between objects (the C decoder alone never lets go of it).

    The body must be UTF-8 (RFC 8259), and every string in it must be text that UTF-8 can carry: raw bytes that
    are not UTF-8 (a surrogate's ED A0 80 included) and lone-surrogate escapes are a 400 naming the field, before
    anything is stored or started."""
    if len(body) > MAX_JSON_CONTAINERS and body.count(b"[") + body.count(b"{") > MAX_JSON_CONTAINERS:
        raise invalid_request(f"The request body holds more than {MAX_JSON_CONTAINERS} arrays and objects.",
                              code="invalid_json")
    try:
        text, malformed = body.decode("utf-8"), False
    except UnicodeDecodeError:  # decoded anyway, to say where: each bad byte becomes a lone surrogate
        text, malformed = body.decode("utf-8", "surrogateescape"), True
    try:
        data = json.loads(text.removeprefix("\ufeff"), parse_constant=_no_constants,
                          object_pairs_hook=_object if yielding else None)
    except (json.JSONDecodeError, ValueError, RecursionError):
        raise invalid_request(
            "We could not parse the JSON body of your request. Send a JSON object (no NaN or Infinity).",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise invalid_request("The request body must be a JSON object.", code="invalid_json")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise invalid_request(f"The request body is nested more than {MAX_JSON_DEPTH} levels deep.",
                              code="invalid_json")
    if malformed or "\\ud" in text or "\\uD" in text:
        where = _not_unicode(data)
        if where is not None:
            param = param_path(where)
            raise invalid_request(
                f"The text of '{param or 'a key'}' is not valid UTF-8 (invalid bytes or a lone surrogate).",
                param=param or None, code="invalid_json")
    return data


def _same(data: dict[str, Any]) -> dict[str, Any]:
    return data


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)  # a Python frame per object: where the interpreter may hand the GIL over


def _too_large() -> APIError:
    return APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code="request_too_large")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _not_unicode(data: Any) -> list[Any] | None:
    """The path of the first string (or key) that UTF-8 cannot encode: it holds a lone surrogate. Walked string by
    string rather than one json.dumps of the body, which would hold the GIL throughout."""
    pending: list[tuple[Any, list[Any]]] = [(data, [])]
    while pending:
        value, path = pending.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                if not _encodable(key):
                    return [*path, key.encode("utf-8", "replace").decode()]
                pending.append((child, [*path, key]))
        elif isinstance(value, list):
            pending.extend((child, [*path, index]) for index, child in enumerate(value))
        elif isinstance(value, str) and not _encodable(value):
            return path
    return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse_unsupported(body: dict[str, Any], unsupported: dict[str, str]) -> None:
    """A 400 saying why for any field the API documents but this server cannot honour."""
    for name, reason in unsupported.items():
        if body.get(name) is not None:
            raise invalid_request(f"`{name}` is not supported: {reason}.", param=name, code="unsupported_parameter")


def type_name(value: Any, param: str) -> str | None:
    """The `type` an object names (a tool, an item, a part), None where it names none; a 400 naming `param` when that
    `type` is not a string. Every lookup of a type in a set or dict goes through here: a list or an object is not
    even hashable, and would be a TypeError (a 500) there."""
    if not isinstance(value, dict) or "type" not in value:
        return None
    kind = value["type"]
    if not isinstance(kind, str):
        raise invalid_request(f"Invalid type for '{param}': expected string.", param=param)
    return kind


def check_tool_types(tools: Any, catalog: ToolCatalog, accepted: frozenset[str] = frozenset({"function"}),
                     refused: dict[str, str] | None = None) -> None:
    """Not too many tools (first: nothing else should have to look at 5,000 of them), and only the tool types the API
    serves here (`accepted`): another type is a 400 naming it and saying why (`refused`: type -> reason), before the
    schema, whose message would be vaguer."""
    try:
        catalog.check_count(tools)
    except ToolError as exc:
        raise invalid_request(str(exc), param=exc.param, code=exc.code) from None
    for position, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = type_name(tool, f"tools[{position}].type")
        if kind not in accepted:
            reason = (refused or {}).get(kind) if kind is not None else None
            raise invalid_request(
                f"Tool type {kind!r} is not supported: "
                f"{reason or 'declare ' + ', '.join(sorted(accepted)) + ' tools'}.",
                param=f"tools[{position}].type",
                code="invalid_value",
            )


@dataclass(frozen=True)
class CompiledSchema:
    validator: jsonschema.Validator  # finds and words errors
    accepts: Predicate  # a fast "valid" for the common case (tools/fast_schema.py)


def compile_schema(schema: dict[str, Any]) -> CompiledSchema:
    jsonschema.Draft202012Validator.check_schema(schema)
    return CompiledSchema(ErrorFinder(schema), compile_predicate(schema))


def check(instance: Any, schema: CompiledSchema, prefix: str = "") -> None:
    """Raise a 400 for the first schema violation, with `param` as OpenAI spells paths. Finding and wording it
    costs the same whatever the size of the body (proxy/schema_errors.py)."""
    if schema.accepts(instance):
        return
    error = first_error(schema.validator, instance)
    if error is None:
        return
    raise _as_api_error(error, prefix)


def param_path(parts: Iterable[Any], prefix: str = "") -> str:
    """OpenAI's spelling of a path (`messages[0].content`); a key is cut to QUOTE_CHARS characters."""
    path = prefix
    for part in parts:
        if not isinstance(part, int):
            part = str(part)[:QUOTE_CHARS]
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def _as_api_error(error: ValidationError, prefix: str) -> APIError:
    param = param_path(error.absolute_path, prefix)
    where = f"'{param}'" if param else "the request body"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = next(jsonschema._utils.find_additional_properties(error.instance, error.schema), None)
        name = param_path([extra], param) if extra is not None else param
        return invalid_request(f"Unrecognized request argument supplied: {name}", param=name)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        name = param_path([missing], param)
        return invalid_request(f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter")
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return invalid_request(f"Invalid type for {where}: expected {expected}.", param=param or None)
    if error.validator in ("enum", "const"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        choices = ", ".join(repr(value) for value in allowed)
        return invalid_request(
            f"Invalid value for {where}: {quote(error.instance)}; supported values are {choices}.",
            param=param or None,
            code="invalid_value",
        )
    if error.validator in _BOUNDS and isinstance(error.instance, int | float):
        return _out_of_bounds(error, where, param)
    return invalid_request(f"Invalid value for {where}: {error.message}.", param=param or None)


# A number past a bound, worded as OpenAI words it: "Invalid 'max_output_tokens': integer below minimum value.
# Expected a value >= 16, but got 10 instead." (code `integer_below_min_value`; `decimal_...` for a number).
_BOUNDS = {"minimum": ("below", "min", ">="), "exclusiveMinimum": ("below", "min", ">"),
           "maximum": ("above", "max", "<="), "exclusiveMaximum": ("above", "max", "<")}


def _out_of_bounds(error: ValidationError, where: str, param: str) -> APIError:
    side, bound, relation = _BOUNDS[str(error.validator)]
    types = error.schema.get("type") if isinstance(error.schema, dict) else None
    kind = "integer" if types == "integer" or (isinstance(types, list) and "number" not in types) else "decimal"
    return invalid_request(f"Invalid {where}: {kind} {side} {bound}imum value. Expected a value {relation} "
                           f"{error.validator_value}, but got {error.instance} instead.", param=param or None,
                           code=f"{kind}_{side}_{bound}_value")
