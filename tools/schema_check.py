"""Is a tool's `parameters` a valid JSON Schema? The 2020-12 meta-schema, checked fast.

`jsonschema`'s own check of a small tool schema takes ~0.7 ms (2020-12 assembles its meta-schema from seven
vocabularies with `$dynamicRef`, which its reference resolver walks on every subschema). The same meta-schema with
its vocabularies merged into one object and `$dynamicRef: "#meta"` turned into `$ref: "#"` means the same thing
(no schema extends it here), and compiled by `tools.fast_schema` it accepts a valid schema in microseconds. Anything
it is not sure of goes to `jsonschema`, which has the last word and words the error.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema_specifications import REGISTRY

from tools.fast_schema import compile_predicate

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
