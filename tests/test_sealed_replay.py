"""A sealed reasoning blob replayed to make the server work (issue 26, item 1): 30,000 repetitive reasoning tokens
seal into about a kilobyte, and a request carrying that blob 1,600 times used to be expanded copy by copy on the
event loop (14 s, /health held 10.5 s, +2.7 GB on the test machine) before its length was checked. Now each blob
opens once per request, decompresses within the context window, and the request is a 400 as fast as plain text of
the same size. `benchmarks/sealed_replay.py` prints the figures against plain text."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from benchmarks.sealed_replay import KEY, measure, plain_body, replay_body
from proxy.errors import APIError
from proxy.responses.request.unseal import Unsealer
from proxy.responses.sealing import AGENT_MESSAGE, REASONING, Sealer, TooLarge
from tests.conftest import MODEL
from tests.test_request_stalls import HealthWatch
from tests.test_store_processes import ServerProcess

# Compaction asks for its summary in a user message after the input, so the reasoning before it stays closed
# (proxy/responses/request/parse.py): a 200 in bounded time and memory.
PATHS = {"/v1/responses": 400, "/v1/responses/input_tokens": 400, "/v1/responses/compact": 200}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("replay")
    live = ServerProcess(None, folder / "store.sqlite3", folder / "server.log", "--reasoning-key", KEY,
                         "--token-delay-ms", "0")
    yield live
    live.stop()


@pytest.mark.parametrize("path", list(PATHS))
def test_a_replayed_blob_costs_what_plain_text_of_its_size_costs(server: ServerProcess, path: str) -> None:
    replay = json.dumps(replay_body(1600, 30000), separators=(",", ":")).encode()
    plain = json.dumps(plain_body(len(replay)), separators=(",", ":")).encode()
    baseline = measure(server, "/v1/responses/input_tokens", plain)
    figure = measure(server, path, replay)
    print(f"\n{path}: replay {figure}, plain text {baseline}")
    assert figure["status"] == PATHS[path]
    assert figure["code"] == ("context_length_exceeded" if PATHS[path] == 400 else None)
    assert figure["grew_mb"] < 100  # was 2.7 GB
    assert figure["held"] < 0.5  # the loop's CPU in one /health round trip (/health waited 10.5 s before)
    assert figure["cpu_seconds"] < max(2 * baseline["cpu_seconds"], 1.0)  # the server's CPU time, not the clock's


def test_a_blob_within_the_window_still_counts_each_copy(server: ServerProcess) -> None:
    """Four copies of 30,000 tokens fit the 131,072-token window: opened once, rendered four times."""
    one = server.request("POST", "/v1/responses/input_tokens", json=replay_body(1, 30000)).json()["input_tokens"]
    four = server.request("POST", "/v1/responses/input_tokens", json=replay_body(4, 30000)).json()["input_tokens"]
    assert one > 30000 and four - one >= 3 * 30000


def test_over_websocket_the_replay_is_an_error_event_and_the_connection_goes_on(server: ServerProcess) -> None:
    async def run() -> tuple[dict[str, Any], float, dict[str, Any]]:
        url = server.url.replace("http://", "ws://") + "/v1/responses"
        async with websockets.connect(url, max_size=None) as socket:
            with HealthWatch(server.url, server.process.pid) as watch:
                await socket.send(json.dumps({"type": "response.create", **replay_body(1600, 30000)}))
                error = json.loads(await socket.recv())
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                          "generate": False}))
            return error, watch.held, json.loads(await socket.recv())

    error, held, after = asyncio.run(run())
    assert error["type"] == "error" and error["error"]["code"] == "context_length_exceeded", error
    assert held < 0.5  # CPU time of the event loop's thread during one /health round trip
    assert after["type"] == "response.created"


def test_many_distinct_blobs_are_opened_off_the_event_loop(server: ServerProcess) -> None:
    """20,000 different small blobs (100,000 tokens, within the window): decrypting them all is work, done in a
    worker thread while other clients are served."""
    sealer = Sealer(KEY)
    items = [{"type": "reasoning", "summary": [], "encrypted_content": sealer.seal_reasoning([1000 + n] * 5, "")}
             for n in range(20000)]
    body = {"model": MODEL, "input": [{"role": "user", "content": "hi"}, *items]}
    with HealthWatch(server.url, server.process.pid) as watch:
        time.sleep(0.05)
        answer = httpx.post(server.url + "/v1/responses/input_tokens", json=body, timeout=None)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["input_tokens"] > 100000
    print(f"\n/health took at most {watch.longest * 1000:.0f} ms, the loop held {watch.held * 1000:.0f} ms")
    assert watch.held < 0.3  # CPU time of the event loop's thread during one /health round trip


class CountingSealer(Sealer):
    """The real sealer, counting the blobs it opens."""

    opened = 0

    def open(self, kind: str, blob: str, max_bytes: int | None = None, refused: Any = None) -> dict[str, Any] | None:
        self.opened += 1
        return super().open(kind, blob, max_bytes, refused)


def test_a_blob_opens_once_per_request_and_never_past_the_budget() -> None:
    sealer = CountingSealer(KEY)
    blob = sealer.seal_reasoning(list(range(1000, 1100)), "")
    unsealer = Unsealer(sealer, 1000)
    for copy in range(10):
        assert unsealer.reasoning(blob, f"input[{copy}]").tokens == tuple(range(1000, 1100))
    assert sealer.opened == 1 and unsealer.left == 0
    with pytest.raises(APIError) as refused:
        unsealer.reasoning(blob, "input[10]")
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, "context_length_exceeded",
                                                                               "input[10]")
    with pytest.raises(APIError):  # larger than the whole budget: refused while decompressing
        Unsealer(sealer, 50).reasoning(blob, "input[0]")
    with pytest.raises(TooLarge):
        sealer.open(REASONING, blob, max_bytes=100)
    assert sealer.open(REASONING, blob, max_bytes=10_000) == {"tokens": list(range(1000, 1100))}
    assert Unsealer(sealer, 1000).reasoning("not a blob", "input[0]") is None  # refused blobs cost nothing


def test_a_compaction_summary_is_budgeted_too() -> None:
    sealer = Sealer(KEY)
    blob = sealer.seal("compaction", {"summary": "x" * 80_000})
    assert Unsealer(sealer, 20_000).summary(blob, "input[0]") == "x" * 80_000
    with pytest.raises(APIError):
        Unsealer(sealer, 5_000).summary(blob, "input[0]")



def _agent_messages(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": MODEL, "input": [{"role": "user", "content": "hi"}, *(
        {"type": "agent_message", "author": "/root", "recipient": "/root/worker", "content": [part]}
        for part in parts)]}


def test_forged_agent_message_blobs_are_opened_off_the_loop_and_logged_once(server: ServerProcess) -> None:
    """15,000 `agent_message` items, each with a forged blob (this server's prefix, a ciphertext altered so it does
    not authenticate): opened in a worker thread, as top-level blobs are, and logged in one line, not 15,000.
    Before: /health held 7.3-9.5 s (control 0.09-0.29 s), 15,000 warnings. The control is the same items with
    their blobs as plain text parts of the same length, measured in the same test."""
    sealer = Sealer(KEY)
    forged = []
    for n in range(15000):
        blob = sealer.seal(AGENT_MESSAGE, {"text": f"task {n}"})
        forged.append(blob[:-8] + ("A" if blob[-8] != "A" else "B") + blob[-7:])  # one ciphertext character off
    plain = [{"type": "input_text", "text": "x" * len(blob)} for blob in forged]
    sealed = [{"type": "encrypted_content", "encrypted_content": blob} for blob in forged]
    path = "/v1/responses/input_tokens"
    logged_before = server.log_text().count("ignored the encrypted_content")
    control = _quicker(server, path, _agent_messages(plain))
    figure = _quicker(server, path, _agent_messages(sealed))
    logged = server.log_text().count("ignored the encrypted_content") - logged_before
    print(f"\n15,000 forged agent_message blobs: {figure}; plain text of the same size: {control}; {logged} log lines")
    assert control["status"] == figure["status"] == 200
    assert logged == 2  # one a request
    assert figure["health"] < 3 * control["health"]  # before: 8x (1.04 s against 0.13 s)


def _quicker(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The figures of the try that held /health the least, of two."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    return min((measure(server, path, raw) for _ in range(2)), key=lambda figure: figure["health"])
