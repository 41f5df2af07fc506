"""Schema-driven fuzzing of every HTTP route: no request a client can send gets a 5xx.

Schemathesis generates requests from the OpenAPI document of the routes (`proxy/openapi.py`, made from the JSON
Schemas the routes validate with) and sends them to the real server on loopback, with the mock engine:

- its coverage phase: for every field, at every depth, values at and past each bound, of every other JSON type,
  missing when required (negative), and the valid boundary values (positive) — the type a parser trusts unchecked;
- its fuzzing phase: MAX_EXAMPLES requests per operation, valid (they reach the engine) and invalid;
- in every JSON-Schema-valued field (response formats, tools' parameters), schemas: nested keywords and `$ref`s
  that chain, cycle, point into arrays, to nothing or outside (`with_schema_structure`).

Bounded and repeatable: hypothesis is derandomized (a fixed seed) and does not shrink; coverage cases are a fixed
set. About 8,500 requests, 40-70 s on two busy cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from starlette.routing import Route

from parsers.vocab import Vocab
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.mock import mock_engine
from proxy.openapi import openapi_document
from proxy.state import ServerState
from proxy.store.sqlite import SQLiteResponseStore
from tests.conftest import LiveServer
from tests.grammars import session_matchers

MAX_EXAMPLES = 10  # generated requests per operation in the fuzzing phase, valid and invalid
# Fields whose value is a client's JSON Schema, which the document types only as an object.
SCHEMA_FIELDS = ("schema", "parameters", "json")
TYPES = ["object", "string", "integer", "number", "boolean", "array", "null"]
# $refs among a few names: to the root, to definitions that refer to each other (chains and cycles), into an array,
# to nothing, and not local.
REFS = ["#", "#/$defs/a", "#/$defs/b", "#/$defs/a/anyOf/0", "#/properties/x", "#a", "#/nothing", "other.json#/x"]


def schema_structure(levels: int) -> dict[str, Any]:
    """What a JSON Schema looks like, `levels` deep: the keywords grammar compilers recurse on, and $refs that form
    chains and cycles (tools/schema_bounds.py bounds them)."""
    node: dict[str, Any] = {"type": "object", "properties": {"type": {"enum": TYPES}, "$ref": {"enum": REFS}}}
    for _ in range(levels):
        node = {"type": "object", "properties": {
            "type": {"enum": TYPES},
            "properties": {"type": "object", "properties": {"x": node, "y": node}},
            "items": node,
            "anyOf": {"type": "array", "items": node, "maxItems": 3},
            "$defs": {"type": "object", "properties": {"a": node, "b": node}},
            "$ref": {"enum": REFS},
            "$anchor": {"enum": ["a", "b"]},
            "enum": {"type": "array", "maxItems": 3},
            "required": {"type": "array", "items": {"enum": ["x", "y"]}},
            "additionalProperties": {"type": "boolean"},
        }}
    return node


def with_schema_structure(document: Any) -> Any:
    """The document, each JSON-Schema-valued field of a request body described as a JSON Schema a level deep, so
    that schemathesis writes schemas, not bare objects, into response_format, text.format, tools' parameters."""
    if isinstance(document, list):
        return [with_schema_structure(item) for item in document]
    if not isinstance(document, dict):
        return document
    return {key: schema_structure(1) if key in SCHEMA_FIELDS and value in ({"type": "object"},
                                                                           {"type": ["object", "null"]})
            else with_schema_structure(value) for key, value in document.items()}


DOCUMENT = with_schema_structure(openapi_document())
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
SCHEMA.config.phases.update(phases=["coverage", "fuzzing"])
SCHEMA.config.generation.update(modes=["positive", "negative"], max_examples=MAX_EXAMPLES, deterministic=True,
                                no_shrink=True)


@pytest.fixture(scope="module")
def server(vocab: Vocab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store = SQLiteResponseStore(tmp_path_factory.mktemp("fuzz") / "responses.sqlite3")
    engine = mock_engine(vocab, 0.0, matchers=session_matchers(vocab))
    live = LiveServer(create_app(ServerState(ServerConfig(), vocab, engine, store)))
    yield live.start()
    live.stop()


def test_the_document_names_every_route(vocab: Vocab) -> None:
    app = create_app(ServerState(ServerConfig(), vocab, mock_engine(vocab, 0.0), None))
    served = {(route.path.replace(":path}", "}"), method.lower()) for route in app.routes if isinstance(route, Route)
              for method in route.methods or () if method != "HEAD"}
    documented = {(path, method) for path, methods in DOCUMENT["paths"].items() for method in methods}
    assert served == documented


@SCHEMA.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx(case: Any, server: LiveServer) -> None:
    response = case.call(base_url=server.base_url, timeout=60)
    assert response.status_code < 500, f"{case.operation.label} {_shown(case.body)}: {response.text[:300]}"


def _shown(body: Any) -> str:
    try:
        return json.dumps(body)[:600]
    except (TypeError, ValueError):
        return repr(body)[:600]
