"""Every grammar a client can send compiles within bounded cost, off the event loop, or is refused with a 400
(issue 26, item 6: grammar compilation is an attack surface, vLLM CVE-2026-55574 and CVE-2026-105757).
proxy/engines/matcher.py compiles under llguidance's own limits (LLParserLimits) and builds the lexer in the
worker thread: `pattern: "^a{200000}$"` took 0.3 to 29 s to build with llguidance's defaults."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from parsers.vocab import Vocab
from proxy.engines.base import OutputConstraint
from proxy.engines.matcher import GrammarError, GrammarMatchers
from tests.conftest import MODEL
from tests.grammars import session_matchers
from tests.test_request_stalls import HealthWatch
from tests.test_store_processes import ServerProcess
from tests.waiting import process_cpu
from tools.definitions import ResponseFormat

LONG_PATTERN = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a{200000}$"}},
                "required": ["a"], "additionalProperties": False}
WIDE_ENUM = {"type": "object", "properties": {"a": {"enum": [f"w{n}x" for n in range(20000)]}}, "required": ["a"],
             "additionalProperties": False}


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("grammars")
    live = ServerProcess(None, folder / "store.sqlite3", folder / "server.log", "--token-delay-ms", "0")
    yield live
    live.stop()


def grammar_of(schema: dict[str, Any]) -> Any:
    return OutputConstraint(response_format=ResponseFormat("answer", schema, strict=True)).grammar


def test_a_long_repetition_compiles_in_bounded_time(vocab: Vocab) -> None:
    matchers = GrammarMatchers(vocab, tokenizer=session_matchers(vocab).tokenizer())
    started = time.process_time()  # CPU time, every thread's: a busy machine does not stretch it
    matcher = matchers.matcher(grammar_of(LONG_PATTERN))
    matcher.compute_bitmask()  # the first mask builds the lexer: the real cost of a compile
    took = time.process_time() - started
    print(f"\n^a{{200000}}$ compiled, lexer built, in {took * 1000:.0f} ms of CPU")
    assert not matcher.is_error() and took < 1.0  # in a worker thread, the GIL released: no stream waits


def test_a_grammar_past_the_limits_is_refused_in_bounded_time(vocab: Vocab) -> None:
    matchers = GrammarMatchers(vocab, tokenizer=session_matchers(vocab).tokenizer())
    started = time.process_time()
    with pytest.raises(GrammarError, match="too big"):
        matchers.matcher(grammar_of(WIDE_ENUM))
    assert time.process_time() - started < 1.0  # CPU seconds


def test_health_stays_fast_while_a_long_pattern_is_compiled(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
            "response_format": response_format(LONG_PATTERN)}
    with HealthWatch(server.url, server.process.pid) as watch:
        time.sleep(0.1)
        answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=None)
        time.sleep(0.1)
    print(f"\n/health took at most {watch.longest * 1000:.0f} ms, the loop held {watch.held * 1000:.0f} ms")
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["choices"][0]["message"]["content"].startswith('{"a": "')
    assert watch.held < 0.2  # CPU time of the event loop's thread during one /health round trip


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_pathological_grammar_is_a_400(server: ServerProcess, path: str) -> None:
    if path == "/v1/responses":
        body = {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "answer",
                                                                  "strict": True, "schema": WIDE_ENUM}}}
    else:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "response_format": response_format(WIDE_ENUM)}
    cpu = process_cpu(server.process.pid)
    answer = httpx.post(server.url + path, json=body, timeout=None)
    took = process_cpu(server.process.pid) - cpu
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    # refused where the request is checked, under the same llguidance limits, naming the schema's field
    assert "too big" in error["message"] and error["param"].endswith("schema"), error
    assert took < 2.0  # the server's CPU seconds for the refusal
