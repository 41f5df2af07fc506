"""A JSON Schema compiled into a fast predicate that accepts only what `jsonschema` accepts.

`jsonschema` spends ~75 us checking one chat message and ~0.7 ms checking a small tool schema against the
2020-12 meta-schema, most of it in its per-keyword machinery. The predicate compiled here costs a few
microseconds. It is one-sided: `True` means the instance is valid; `False` means "not sure", and the caller asks
`jsonschema`, which finds the error and words the message. It may say "not sure" more often than needed (a float
where an integer is expected, enums of numbers), never "valid" for an invalid instance; the tests compare the two
on generated instances. Only the keywords our schemas use are compiled; any other keyword is an error at import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import FormatChecker

Predicate = Callable[[Any], bool]

# Keywords that describe and never constrain.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples", "$comment", "$schema",
    "$id", "$vocabulary", "$defs",
})
_TYPES: dict[str, Predicate] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),  # 1.0 is valid too: "not sure"
    "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
}


def _always(_: Any) -> bool:
    return True


def _never(_: Any) -> bool:
    return False


def _all_of(checks: list[Predicate]) -> Predicate:
    # Closures rather than all(generator): these run for every node of every request body.
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda x: first(x) and second(x)

    def check(x: Any) -> bool:
        for test in checks:
            if not test(x):
                return False
        return True

    return check


def compile_predicate(schema: Any, format_checker: FormatChecker | None = None) -> Predicate:
    """The predicate of `schema`; `$ref` may point at "#" or "#/$defs/NAME" of this same schema."""
    defs: dict[str, Predicate] = {}
    compiler = _Compiler(defs, format_checker)
    root = compiler.compile(schema)
    if isinstance(schema, dict):
        for name, subschema in schema.get("$defs", {}).items():
            defs[name] = compiler.compile(subschema)
    defs["#"] = root
    return root


class _Compiler:
    def __init__(self, defs: dict[str, Predicate], format_checker: FormatChecker | None) -> None:
        self._defs = defs  # filled after compiling: references are resolved when first called
        self._formats = format_checker

    def compile(self, schema: Any) -> Predicate:
        if schema is True or schema == {}:
            return _always
        if schema is False:
            return _never
        if not isinstance(schema, Mapping):
            raise TypeError(f"not a schema: {schema!r}")
        checks: list[Predicate] = []
        for keyword, value in schema.items():
            if keyword in _ANNOTATIONS or keyword == "additionalProperties":
                continue
            make = getattr(self, "_" + keyword.lstrip("$"), None)
            if make is None:
                raise ValueError(f"keyword {keyword!r} is not compiled")
            check = make(value, schema)
            if check is not None:
                checks.append(check)
        if "additionalProperties" in schema and "properties" not in schema:
            checks.append(self._properties({}, schema))
        return _all_of(checks)

    def _type(self, value: str | list[str], schema: Mapping[str, Any]) -> Predicate:
        kinds = [value] if isinstance(value, str) else list(value)
        tests = [_TYPES[kind] for kind in kinds]
        if len(tests) == 1:
            return tests[0]
        return lambda x: any(test(x) for test in tests)

    def _enum(self, values: list[Any], schema: Mapping[str, Any]) -> Predicate:
        # Same type and equal: 1 and True differ, as in jsonschema; 1 and 1.0 are "not sure".
        simple = [(type(v), v) for v in values if v is None or isinstance(v, (str, int, float))]
        return lambda x: any(type(x) is kind and x == v for kind, v in simple)

    def _const(self, value: Any, schema: Mapping[str, Any]) -> Predicate:
        return self._enum([value], schema)

    def _required(self, names: list[str], schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not isinstance(x, dict) or all(name in x for name in names)

    def _properties(self, properties: Mapping[str, Any], schema: Mapping[str, Any]) -> Predicate:
        known = {name: self.compile(sub) for name, sub in properties.items()}
        extra_schema = schema.get("additionalProperties", True)
        extra = None if extra_schema is True else self.compile(extra_schema)

        def check(x: Any) -> bool:
            if not isinstance(x, dict):
                return True
            for key, value in x.items():
                test = known.get(key, extra)
                if test is not None and not test(value):
                    return False
            return True

        return check

    def _items(self, items: Any, schema: Mapping[str, Any]) -> Predicate:
        test = self.compile(items)

        def check(x: Any) -> bool:
            if isinstance(x, list):
                for item in x:
                    if not test(item):
                        return False
            return True

        return check

    def _anyOf(self, branches: list[Any], schema: Mapping[str, Any]) -> Predicate:
        tests = [self.compile(branch) for branch in branches]

        def check(x: Any) -> bool:
            for test in tests:
                if test(x):
                    return True
            return False

        return check

    def _propertyNames(self, names: Any, schema: Mapping[str, Any]) -> Predicate:
        test = self.compile(names)
        return lambda x: not isinstance(x, dict) or all(test(key) for key in x)

    def _minItems(self, n: int, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not isinstance(x, list) or len(x) >= n

    def _maxItems(self, n: int, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not isinstance(x, list) or len(x) <= n

    def _maxProperties(self, n: int, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not isinstance(x, dict) or len(x) <= n

    def _minLength(self, n: int, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not isinstance(x, str) or len(x) >= n

    def _maxLength(self, n: int, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not isinstance(x, str) or len(x) <= n

    def _minimum(self, n: float, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not _TYPES["number"](x) or x >= n

    def _maximum(self, n: float, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not _TYPES["number"](x) or x <= n

    def _exclusiveMinimum(self, n: float, schema: Mapping[str, Any]) -> Predicate:
        return lambda x: not _TYPES["number"](x) or x > n

    def _pattern(self, pattern: str, schema: Mapping[str, Any]) -> Predicate:
        search = re.compile(pattern).search  # jsonschema uses re.search too
        return lambda x: not isinstance(x, str) or search(x) is not None

    def _uniqueItems(self, unique: bool, schema: Mapping[str, Any]) -> Predicate | None:
        if not unique:
            return None
        # Strings only (the meta-schema's `type` and `required` lists); anything else is "not sure".
        return lambda x: not isinstance(x, list) or (
            all(isinstance(item, str) for item in x) and len(set(x)) == len(x))

    def _format(self, name: str, schema: Mapping[str, Any]) -> Predicate | None:
        if self._formats is None:
            return None
        conforms = self._formats.conforms
        return lambda x: conforms(x, name)

    def _ref(self, reference: str, schema: Mapping[str, Any]) -> Predicate:
        if reference == "#":
            name = "#"
        elif reference.startswith("#/$defs/") and "/" not in reference[len("#/$defs/"):]:
            name = reference[len("#/$defs/"):]
        else:
            raise ValueError(f"reference {reference!r} is not compiled")
        defs = self._defs
        return lambda x: defs[name](x)
