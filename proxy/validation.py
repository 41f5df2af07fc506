"""Request bodies: read as JSON, checked against a JSON Schema, every failure a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match
from starlette.requests import Request

from proxy.errors import APIError, invalid_request

MAX_BODY_BYTES = 64 * 1024 * 1024


async def read_json_object(request: Request) -> dict[str, Any]:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise invalid_request(
            "We could not parse the JSON body of your request. Send a JSON object.", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise invalid_request("The request body must be a JSON object.", code="invalid_json")
    return data


def refuse_unsupported(body: dict[str, Any], unsupported: dict[str, str]) -> None:
    """A 400 saying why for any field the API documents but this server cannot honour."""
    for name, reason in unsupported.items():
        if body.get(name) is not None:
            raise invalid_request(f"`{name}` is not supported: {reason}.", param=name, code="unsupported_parameter")


def check_tool_types(tools: Any) -> None:
    """Only function tools: another type is a 400 naming it (before the schema, whose message would be vaguer)."""
    for position, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise invalid_request(
                f"Tool type {kind!r} is not supported: declare function tools only.",
                param=f"tools[{position}].type",
                code="invalid_value",
            )


def compile_schema(schema: dict[str, Any]) -> jsonschema.Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def check(instance: Any, validator: jsonschema.Validator, prefix: str = "") -> None:
    """Raise a 400 for the most relevant schema violation, with `param` as OpenAI spells paths."""
    error = best_match(validator.iter_errors(instance))
    if error is None:
        return
    raise _as_api_error(error, prefix)


def param_path(parts: Iterable[Any], prefix: str = "") -> str:
    path = prefix
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _as_api_error(error: ValidationError, prefix: str) -> APIError:
    param = param_path(error.absolute_path, prefix)
    where = f"'{param}'" if param else "the request body"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = sorted(key for key in error.instance if key not in known)
        name = param_path([extra[0]], param) if extra else param
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
            f"Invalid value for {where}: {error.instance!r}; supported values are {choices}.",
            param=param or None,
            code="invalid_value",
        )
    return invalid_request(f"Invalid value for {where}: {error.message}.", param=param or None)
