"""A client's JSON Schema can neither kill the server nor hold its event loop (issue 34, items 1 and 7).

llguidance compiles a schema by recursion on the C stack: a `$ref` chain of ~3,000 links, or a cycle of ~1,000
definitions, overflowed it and killed the process (SIGSEGV) from one ~100 kB request, on every engine. Every schema
is now bounded by tools/schema_bounds.py before any native library sees it, and llguidance checks it in a worker
thread under its own limits. The corpus below runs against the real server on every route that takes a schema;
the server must answer each request, and stay up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL
from tests.test_request_stalls import HealthWatch
from tests.test_store_processes import ServerProcess
from tests.waiting import process_cpu
from tools.schema_bounds import MAX_RESOLUTION_DEPTH, REF_COST, schema_bounds_error


def ref_chain(links: int) -> dict[str, Any]:
    definitions: dict[str, Any] = {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(links)}
    definitions[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "required": ["a"],
            "additionalProperties": False, "$defs": definitions}


def ref_cycle(links: int) -> dict[str, Any]:
    """Definitions that each nest the next one a few levels down, the last pointing back to the first."""
    definitions = {f"d{n}": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "x": {"$ref": f"#/$defs/d{(n + 1) % links}"}}}]} for n in range(links)}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": definitions}


def anchor_cycle(links: int) -> dict[str, Any]:
    """The same through `$anchor`s, which name no path."""
    definitions = {f"d{n}": {"$anchor": f"a{n}", "type": "object",
                             "properties": {"x": {"$ref": f"#a{(n + 1) % links}"}}} for n in range(links)}
    return {"type": "object", "properties": {"a": {"$ref": "#a0"}}, "$defs": definitions}


def wide_any_of(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"anyOf": [
        {"type": "object", "properties": {f"k{n}": {"type": "integer"}}, "required": [f"k{n}"],
         "additionalProperties": False} for n in range(count)]}}, "required": ["a"], "additionalProperties": False}


def optional_properties(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{n}": {"type": "string"} for n in range(count)},
            "additionalProperties": False}


def deep_nesting(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def huge_enum(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"enum": [f"w{n}x" for n in range(count)]}}, "required": ["a"],
            "additionalProperties": False}


# The schemas that crashed the server or held its loop, and their neighbours.
HOSTILE = {
    "ref chain of 5,000": ref_chain(5_000),
    "ref chain of 900": ref_chain(900),
    "ref cycle of 2,000": ref_cycle(2_000),
    "ref cycle of 300": ref_cycle(300),
    "anchor cycle of 600": anchor_cycle(600),
    "anyOf of 2,000": wide_any_of(2_000),
    "10,000 optional properties": optional_properties(10_000),
    "nested 25 deep": deep_nesting(25),  # 50 levels of JSON: past the schema bound, within the body's
    "enum of 20,000": huge_enum(20_000),
}


def chat(schema: dict[str, Any], strict: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": strict,
                                                                   "schema": schema}}}


def chat_tool(schema: dict[str, Any], strict: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": strict}}]}


def responses(schema: dict[str, Any], strict: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 20, "store": False,
                             "text": {"format": {"type": "json_schema", "name": "answer", "strict": strict,
                                                 "schema": schema}}}


def responses_tool(schema: dict[str, Any], strict: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 20, "store": False,
                             "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": strict}]}


def completions(schema: dict[str, Any], strict: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 20,
                               "structured_outputs": {"json": schema}}


ROUTES = {"chat response_format": chat, "chat tool": chat_tool, "responses text.format": responses,
          "responses tool": responses_tool, "completions structured_outputs": completions}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("hostile-schemas")
    live = ServerProcess(None, folder / "store.sqlite3", folder / "server.log", "--token-delay-ms", "0")
    yield live
    live.stop()


# Within the bounds, but past llguidance's own limits (LLGUIDANCE_LIMITS): refused when strict, else held to any
# JSON object (as any schema llguidance cannot compile leniently).
PAST_LLGUIDANCE_LIMITS = {"enum of 20,000"}


@pytest.mark.parametrize("name", sorted(set(HOSTILE) - PAST_LLGUIDANCE_LIMITS - {"nested 25 deep"}))
def test_the_bounds_refuse_what_would_overflow_a_stack(name: str) -> None:
    problem = schema_bounds_error(HOSTILE[name])
    assert problem is not None
    print(f"\n{name}: {problem}")


def test_real_schemas_are_within_the_bounds() -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    mutual = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}},
                        "b": {"type": "array", "items": {"$ref": "#/$defs/a"}}},
              "type": "object", "properties": {"root": {"$ref": "#/$defs/a"}}}
    for schema in (tree, mutual, ref_chain(100), ref_cycle(40), optional_properties(5_000), wide_any_of(1_000),
                   {"type": "object", "properties": {"self": {"$ref": "#"}}}):
        assert schema_bounds_error(schema) is None


def test_the_longest_chain_within_the_bounds_compiles_on_an_eight_mib_stack() -> None:
    """The bound's margin, shown on llguidance itself: the longest chain the bounds let through compiles in a
    fresh process's main thread (8 MiB of stack), and a chain ten times as long, which the bounds refuse, kills it."""
    links = MAX_RESOLUTION_DEPTH // (1 + REF_COST) - 5  # each link weighs 1 + REF_COST; the root a few more
    assert schema_bounds_error(ref_chain(links)) is None
    assert schema_bounds_error(ref_chain(links * 10)) is not None
    program = ("import json, sys, llguidance; schema = json.loads(sys.stdin.read()); "
               "grammar = llguidance.LLMatcher.grammar_from_json_schema(schema); "
               "print(llguidance.LLMatcher.validate_grammar_with_warnings(grammar))")
    for chain, survives in ((ref_chain(links), True), (ref_chain(links * 10), False)):
        run = subprocess.run([sys.executable, "-c", program], input=json.dumps(chain), capture_output=True,
                             text=True, timeout=120, check=False)
        assert (run.returncode == 0) == survives, (run.returncode, run.stderr[-300:])


@pytest.mark.parametrize(("route", "strict"), [(route, strict) for route in ROUTES for strict in (True, False)
                                               if strict or route != "completions structured_outputs"])
def test_every_hostile_schema_is_answered_and_the_server_stays_up(server: ServerProcess, route: str,
                                                                   strict: bool) -> None:
    """structured_outputs.json (vLLM's field on /v1/completions) has no strict switch: it runs once."""
    with httpx.Client(timeout=120) as client:
        for name, schema in HOSTILE.items():
            path, body = ROUTES[route](schema, strict)
            answer = client.post(server.url + path, json=body)
            assert server.process.poll() is None, name
            lenient = not strict or route == "completions structured_outputs"  # vLLM's field has no strict
            if name in PAST_LLGUIDANCE_LIMITS and lenient:  # held to any object; as a tool, too long to declare
                assert answer.status_code == 200 or answer.json()["error"]["code"] == "context_length_exceeded", (
                    name, answer.status_code, answer.text[:300])
                continue
            assert answer.status_code == 400, (name, answer.status_code, answer.text[:300])
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"], (name, error)
        assert client.get(server.url + "/health").status_code == 200


def test_a_new_expensive_schema_is_checked_off_the_event_loop(server: ServerProcess) -> None:
    """5,000 optional properties (within the bounds) take llguidance most of a CPU-second to check. The event loop's
    thread meanwhile spends a small part of that on any one /health round trip: the check runs in a worker thread.
    The control is the CPU time the server spent on the request."""
    path, body = chat_tool(optional_properties(5_000), strict=True)
    body["tool_choice"] = "none"  # the check, not the generation, is what is measured
    with httpx.Client(timeout=None) as client:
        client.get(server.url + "/health")
        with HealthWatch(server.url, server.process.pid) as watch:
            time.sleep(0.05)
            before = process_cpu(server.process.pid)
            answer = client.post(server.url + path, json=body)
            spent = process_cpu(server.process.pid) - before
            time.sleep(0.05)
    print(f"\nthe server spent {spent * 1000:.0f} CPU-ms on the request; its loop at most {watch.held * 1000:.0f} ms "
          "in one /health round trip")
    assert answer.status_code == 200, answer.text[:300]
    assert watch.held < spent / 3
