"""Schema-driven fuzzing of every HTTP route: no request a client can send gets a 5xx.

Schemathesis generates requests from the OpenAPI document of the routes (`proxy/openapi.py`, made from the JSON
Schemas the routes validate with) and sends them to the real server on loopback, with the mock engine:

- its coverage phase: for every field, at every depth, values at and past each bound, of every other JSON type,
  missing when required (negative), and the valid boundary values (positive) — the type a parser trusts unchecked;
- its fuzzing phase: MAX_EXAMPLES requests per operation, valid (they reach the engine) and invalid.

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
DOCUMENT = openapi_document()
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
