"""Bodies built to make the server work: each is refused in time bounded by what it takes to read the body, not by
how many wrong values it holds, and no other client waits meanwhile (the event loop is never held for long)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest

from proxy.chat.request import parse_chat_request
from proxy.completions import _REQUEST as COMPLETIONS
from proxy.errors import APIError
from proxy.responses.request.parse import parse_responses_request
from proxy.validation import check
from tests.conftest import MODEL
from tests.test_store_processes import ServerProcess
from tests.waiting import process_cpu

MANY = 1_500_000  # wrong items in one list: a 3 to 6 MB body
HI = [{"role": "user", "content": "hi"}]

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"messages": [0] * MANY}, "messages[0]"),
    ("/v1/chat/completions", {"messages": HI, "stop": [0] * MANY}, "stop"),
    ("/v1/chat/completions", {"messages": HI, "tools": [0] * MANY}, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [0] * MANY}]}, "messages[0].content"),
    ("/v1/responses", {"input": [0] * MANY}, "input"),
    ("/v1/responses", {"input": "hi", "include": [0] * MANY}, "include"),
    ("/v1/responses", {"input": "hi", "tools": [0] * MANY}, "tools"),
    ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": [0] * MANY}]}, "input[0]"),
    ("/v1/completions", {"prompt": "hi", "stop": [0] * MANY}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": ["x"] * MANY}, "stop_token_ids"),
    ("/v1/completions", {"prompt": [1] + [-1] * MANY}, "prompt"),
    ("/tokenize", {"messages": [0] * MANY}, "messages[0]"),
    ("/tokenize", {"messages": HI, "stop": [0] * MANY}, "stop"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("stalls")
    script = folder / "script.jsonl"
    script.write_text(json.dumps({"completion": "<|channel|>final<|message|>Hi.<|return|>"}) + "\n", encoding="utf-8")
    live = ServerProcess(script, folder / "store.sqlite3", folder / "server.log", "--token-delay-ms", "0")
    yield live
    live.stop()


class HealthWatch:
    """GET /health back to back in a thread, while the server (process `pid`) works on something else. `held`: the
    most CPU time the server's event loop (its main thread) spent during one /health round trip, which is how long
    work on the loop held it: a busy machine stretches the round trips (`longest`, printed), not that CPU time."""

    def __init__(self, url: str, pid: int) -> None:
        self._url = url
        self._pid = pid
        self.longest = 0.0
        self.held = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=None) as client:
            while not self._stop.is_set():
                started, cpu = time.perf_counter(), process_cpu(self._pid, self._pid)
                assert client.get(self._url + "/health").status_code == 200
                self.held = max(self.held, process_cpu(self._pid, self._pid) - cpu)
                self.longest = max(self.longest, time.perf_counter() - started)
                time.sleep(0.002)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _refusal(server: ServerProcess, path: str, body: bytes) -> tuple[httpx.Response, float, float]:
    """The answer, the server's CPU time for it (the less of two tries), and the most its event loop was held."""
    with httpx.Client(timeout=None) as client:
        client.get(server.url + "/health")  # connected already: the measure is the request's
        costs = []
        with HealthWatch(server.url, server.process.pid) as watch:
            for _ in range(2):
                cpu = process_cpu(server.process.pid)
                response = client.post(server.url + path, content=body, headers={"content-type": "application/json"})
                costs.append(process_cpu(server.process.pid) - cpu)
    return response, min(costs), watch.held


@pytest.mark.parametrize(("path", "fields", "param"), CASES)
def test_a_list_of_wrong_items_is_refused_at_once(server: ServerProcess, path: str, fields: dict[str, Any],
                                                  param: str) -> None:
    """Before: 12 to 34 s of CPU to word each 400, other clients' requests held up to 9.7 s. The floor is what
    any body of that size costs (read and decode it): the same list under a key refused at once."""
    body = json.dumps({"model": MODEL, **fields}, separators=(",", ":")).encode()
    longest = max((value for value in fields.values() if isinstance(value, list)), key=len)
    floor = json.dumps({"model": MODEL, "junk": longest}, separators=(",", ":")).encode()
    refused, took, held = _refusal(server, path, body)
    baseline, floor_took, floor_held = _refusal(server, path, floor)
    print(f"\n{path} {param}: {len(body) / 1e6:.1f} MB, 400 in {took * 1000:.0f} ms of CPU "
          f"(floor {floor_took * 1000:.0f} ms), the loop held at most {held * 1000:.0f} ms "
          f"(floor {floor_held * 1000:.0f} ms)")
    assert refused.status_code == 400 and baseline.status_code == 400, refused.text[:300]
    error = refused.json()["error"]
    assert error["param"].startswith(param), error
    assert len(refused.content) < 1000  # the error quotes a bounded part of the value
    # CPU time, compared with the floor's: a busy machine stretches neither (before: 12 to 34 s, held up to 9.7 s)
    assert took <= 3 * floor_took + 0.3 and held <= 2 * floor_held + 0.2


@pytest.mark.parametrize(("path", "fields", "param"), CASES)
def test_finding_and_wording_the_error_does_not_grow_with_the_list(path: str, fields: dict[str, Any],
                                                                   param: str) -> None:
    """The part of a refusal that used to grow with the list: checking the decoded body and wording its 400."""
    body = {"model": MODEL, **fields}
    parse = {"/v1/responses": lambda: parse_responses_request(body, "medium", MODEL),
             "/v1/completions": lambda: check(body, COMPLETIONS)}.get(path, lambda: parse_chat_request(body, "medium"))
    times = []
    for _ in range(3):  # the least of three
        started = time.thread_time()  # CPU time: a busy machine does not stretch it
        with pytest.raises(APIError) as refused:
            parse()
        times.append(time.thread_time() - started)
    took = min(times)
    assert refused.value.status == 400 and refused.value.param.startswith(param)
    assert len(refused.value.message) < 400
    assert took < 0.05, f"{took * 1000:.0f} ms of CPU"


def test_a_full_queue_refuses_before_reading_the_body(tmp_path: Path) -> None:
    """With the one slot taken and no room to wait, a request is a 429 whatever its body: the server does not
    parse and check a body it could not serve (a 3 MB body of wrong items would otherwise be a 400)."""
    script = tmp_path / "long.jsonl"
    script.write_text(json.dumps({"completion": "<|channel|>final<|message|>" + " word" * 300 + "<|return|>"}) + "\n",
                      encoding="utf-8")
    server = ServerProcess(script, tmp_path / "store.sqlite3", tmp_path / "server.log",
                           "--max-concurrent-requests", "1", "--max-queue", "0")
    try:
        with httpx.Client(timeout=30) as client, client.stream(
            "POST", server.url + "/v1/chat/completions", json={"model": MODEL, "messages": HI, "stream": True}
        ) as holding:
            lines = holding.iter_lines()  # kept: a dropped iterator would close the stream
            next(lines)  # generating: the slot is taken
            for path, fields, _ in CASES[:2] + CASES[4:5] + CASES[8:9]:
                body = json.dumps({"model": MODEL, **fields}, separators=(",", ":")).encode()
                refused = client.post(server.url + path, content=body, headers={"content-type": "application/json"})
                assert refused.status_code == 429, (path, refused.text[:200])
                assert refused.headers["retry-after"] == "1"
    finally:
        server.stop()


def test_the_mock_engines_first_grammar_does_not_stall_the_server(tmp_path: Path) -> None:
    """The grammar tokenizer (a second or two of work that holds the GIL) is built at start-up, not by the first
    request that has a grammar: before, that request held every other client for 0.4 to 1.8 s."""
    server = ServerProcess(None, tmp_path / "store.sqlite3", tmp_path / "server.log", "--token-delay-ms", "0")
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "call f"}], "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}]}
        with HealthWatch(server.url, server.process.pid) as watch:
            time.sleep(0.1)
            answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=None)
            time.sleep(0.1)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
        print(f"\n/health took at most {watch.longest * 1000:.0f} ms, the loop held {watch.held * 1000:.0f} ms")
        assert watch.held < 0.3  # CPU time of the loop: the tokenizer's 0.4 to 1.8 s would show
    finally:
        server.stop()


@pytest.mark.parametrize("items", [[[]] * MANY, [{}] * MANY, [[0]] * MANY])
def test_millions_of_arrays_or_objects_are_refused_before_they_are_built(server: ServerProcess,
                                                                         items: list[Any]) -> None:
    """Building them holds the GIL whatever decodes them (the garbage collector walks them all, more than once):
    1.3 s of decoding and 130 ms stalls for 2.7 million empty arrays."""
    body = json.dumps({"model": MODEL, "messages": HI, "stop": items}, separators=(",", ":")).encode()
    refused, took, held = _refusal(server, "/v1/chat/completions", body)
    print(f"\n{len(body) / 1e6:.1f} MB: 400 in {took * 1000:.0f} ms of CPU, the loop held at most {held * 1000:.0f} ms")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_json"
    assert "arrays and objects" in refused.json()["error"]["message"]
    assert took < 0.5 and held < 0.3  # CPU time: 1.3 s of decoding, 130 ms stalls before
