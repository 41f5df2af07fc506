"""Finding and wording a JSON Schema violation in time that does not grow with the body.

`jsonschema` words its errors with the `repr` of the whole offending value, and `anyOf`/`oneOf` collect every
error of every branch: a list of a million wrong items took seconds of CPU, holding the event loop, to word one
400. `ErrorFinder` is Draft 2020-12 with those keywords replaced: the branches of `anyOf` report their first error
only, and messages quote a bounded part of a value (`quote`). `first_error` stops at the first violation.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, relevance
from jsonschema.validators import extend

QUOTE_CHARS = 100  # at most this much of a client's value is quoted back in an error message

Keyword = Iterator[ValidationError]


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A short rendering of a client's value: containers by size, long text cut, never more than ~`limit` chars."""
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} properties"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _any_of(validator: Any, subschemas: list[Any], instance: Any, schema: Any) -> Keyword:
    firsts = []
    for index, subschema in enumerate(subschemas):
        error = next(validator.descend(instance, subschema, schema_path=index), None)
        if error is None:
            return
        firsts.append(error)
    yield ValidationError(f"{quote(instance)} is not valid under any of the given schemas", context=firsts)


def _one_of(validator: Any, subschemas: list[Any], instance: Any, schema: Any) -> Keyword:
    valid = [index for index, subschema in enumerate(subschemas)
             if validator.evolve(schema=subschema).is_valid(instance)]
    if not valid:
        yield from _any_of(validator, subschemas, instance, schema)
    elif len(valid) > 1:
        yield ValidationError(f"{quote(instance)} is valid under more than one of the given schemas")


def _type(validator: Any, types: Any, instance: Any, schema: Any) -> Keyword:
    types = [types] if isinstance(types, str) else types
    if not any(validator.is_type(instance, kind) for kind in types):
        yield ValidationError(f"{quote(instance)} is not of type {', '.join(repr(kind) for kind in types)}")


def _enum(validator: Any, enums: list[Any], instance: Any, schema: Any) -> Keyword:
    if not any(jsonschema._utils.equal(each, instance) for each in enums):
        yield ValidationError(f"{quote(instance)} is not one of {quote(enums) if len(enums) > 20 else repr(enums)}")


def _const(validator: Any, const: Any, instance: Any, schema: Any) -> Keyword:
    if not jsonschema._utils.equal(instance, const):
        yield ValidationError(f"{const!r} was expected")


def _bound(kind: str, measure: str, most: bool) -> Any:
    def check(validator: Any, limit: int, instance: Any, schema: Any) -> Keyword:
        if validator.is_type(instance, kind) and (len(instance) > limit if most else len(instance) < limit):
            yield ValidationError(f"has {len(instance)} {measure}; at {'most' if most else 'least'} {limit} allowed")
    return check


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Keyword:
    if not validator.is_type(instance, "object"):
        return
    extras = jsonschema._utils.find_additional_properties(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed:
        extra = next(extras, None)
        if extra is not None:
            yield ValidationError(f"Additional properties are not allowed ({quote(extra)} was unexpected)")


ErrorFinder = extend(jsonschema.Draft202012Validator, {
    "anyOf": _any_of,
    "oneOf": _one_of,
    "type": _type,
    "enum": _enum,
    "const": _const,
    "minItems": _bound("array", "items", most=False),
    "maxItems": _bound("array", "items", most=True),
    "minLength": _bound("string", "characters", most=False),
    "maxLength": _bound("string", "characters", most=True),
    "minProperties": _bound("object", "properties", most=False),
    "maxProperties": _bound("object", "properties", most=True),
    "additionalProperties": _additional_properties,
})


def first_error(validator: jsonschema.Validator, instance: Any) -> ValidationError | None:
    """The first violation, narrowed into `anyOf` branches as `best_match` does, without looking for others."""
    error = next(validator.iter_errors(instance), None)
    while error is not None and error.context:
        smallest = heapq.nsmallest(2, error.context, key=relevance)
        if len(smallest) == 2 and relevance(smallest[0]) == relevance(smallest[1]):
            break
        error = smallest[0]
    return error
