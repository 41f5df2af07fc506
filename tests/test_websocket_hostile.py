"""The Responses WebSocket against a hostile client (proxy/responses/transport/websocket.py, ws_messages.py): no
message ends the connection except by the protocol's own close codes, a response running on it is never lost, a
flood does not hold other requests, and the API key is never echoed."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER
from tests.test_websocket import TERMINAL, until_done, ws_url

LONG = "<|channel|>final<|message|>" + "word " * 300 + "<|return|>"
FLOOD = 20_000

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=8)
_FIELDS = ["response_id", "stream_id", "generate", "response", "model", "input", "previous_response_id", "store",
           "tools", "event_id"]
# Every message type with every field it reads, each any JSON value; then unknown types and non-objects.
_MESSAGE = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(["response.create", "response.cancel", "response.processed", "response.steer"]) | _JSON,
    st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=4),
).map(json.dumps) | _JSON.map(json.dumps) | st.text(max_size=20)


@pytest.fixture(scope="module")
def server(vocab: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from proxy.app import create_app
    from proxy.config import ServerConfig
    from proxy.state import ServerState
    from proxy.store.sqlite import SQLiteResponseStore

    store = SQLiteResponseStore(tmp_path_factory.mktemp("ws") / "responses.sqlite3")
    engine = scripted_engine(vocab, [LONG], token_delay=0.001)
    live = LiveServer(create_app(ServerState(ServerConfig(), vocab, engine, store)), engine).start()
    yield live
    live.stop()


@settings(max_examples=40, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(hostile=st.lists(_MESSAGE, min_size=1, max_size=8))
def test_no_message_ends_the_connection_or_loses_a_running_response(server: LiveServer, hostile: list[str]) -> None:
    """Any messages of every type (each field any JSON value), unknown types, junk: answered by events (never a
    5xx), the connection open, and a response running meanwhile completes and is stored."""
    async def run() -> tuple[dict[str, str], str]:
        ends: dict[str, str] = {}
        probe = ""
        async with websockets.connect(ws_url(server), max_size=None) as socket:
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                          "stream_id": "probe"}))
            for message in hostile:
                await socket.send(message)
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                          "stream_id": "last"}))
            while len(ends) < 2:  # as long as events come (pytest-timeout catches a hang)
                event = json.loads(await socket.recv())
                assert event["type"] != "error" or event["status"] < 500, event  # a client's message: never 5xx
                lane = event.get("stream_id")
                if lane in ("probe", "last") and event["type"] in TERMINAL:
                    ends[lane] = event["type"]
                    probe = event["response"]["id"] if lane == "probe" else probe
        return ends, probe

    ends, probe = asyncio.run(run())  # a connection closed by the server raises here
    assert (ends["probe"], ends["last"]) == ("response.completed", "response.completed")
    stored = httpx.get(f"{server.base_url}/v1/responses/{probe}", timeout=10)
    assert stored.status_code == 200 and stored.json()["status"] == "completed"


@pytest.mark.parametrize("message", [
    {"type": "response.cancel", "response_id": ["x"]},
    {"type": "response.cancel", "response_id": {"x": 1}},
    {"type": "response.cancel"},
    {"type": "response.processed", "response_id": 5},
    {"type": ["response.create"]},
    {"type": "response.create", "response": []},
])
def test_a_field_of_the_wrong_type_is_an_error_event_naming_it(server: LiveServer, message: dict[str, Any]) -> None:
    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(ws_url(server)) as socket:
            await socket.send(json.dumps(message))
            return await until_done(socket)

    error = asyncio.run(run())[-1]
    assert error["type"] == "error" and error["status"] == 400, error
    assert error["error"]["param"] in ("response_id", "type", "response")


def test_binary_frames_are_text_and_invalid_utf8_closes_with_1007(server: LiveServer) -> None:
    async def run() -> tuple[str, int | None]:
        async with websockets.connect(ws_url(server)) as socket:
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hé",
                                          "max_output_tokens": 16}).encode())
            final = (await until_done(socket))[-1]["type"]
            with pytest.raises(websockets.ConnectionClosed):
                await socket.send(b'{"type": "response.create", "input": "\xff"}')
                # The control: on a connection left open, this one is answered, and recv returns its first event.
                await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                              "max_output_tokens": 16}))
                await socket.recv()
            return final, socket.close_code

    final, code = asyncio.run(run())
    assert final in ("response.completed", "response.incomplete")
    assert code == 1007


def test_the_api_key_is_never_echoed_as_the_subprotocol(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=scripted_engine(vocab, [ANSWER]), api_key="sekrit")

    async def run() -> tuple[str | None, str]:
        async with websockets.connect(ws_url(server), subprotocols=[  # type: ignore[list-item]
                "openai-insecure-api-key.sekrit"]) as socket:
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
            assert (await until_done(socket))[-1]["type"] == "response.completed"
            return socket.subprotocol, str(socket.response.headers)

    chosen, headers = asyncio.run(run())
    assert chosen is None and "sekrit" not in headers


def test_a_failed_continuation_evicts_its_previous_response(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """Open Responses: a store:false continuation that fails evicts the previous_response_id it continued, so
    continuing from it again is previous_response_not_found."""
    server = serve(engine=scripted_engine(vocab, [ANSWER]))

    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(ws_url(server)) as socket:
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
            first = (await until_done(socket))[-1]["response"]["id"]
            continuation = {"type": "response.create", "model": MODEL, "store": False, "previous_response_id": first}
            await socket.send(json.dumps({**continuation, "input": "hi", "temperature": 9}))
            failed = (await until_done(socket))[-1]
            await socket.send(json.dumps({**continuation, "input": "again"}))
            return [failed, (await until_done(socket))[-1]]

    failed, again = asyncio.run(run())
    assert failed["type"] == "error" and failed["status"] == 400
    assert again["type"] == "error" and again["error"]["code"] == "previous_response_not_found"


# A client in a process of its own (in this one, it would take the GIL from the server's thread): it writes `count`
# small invalid messages, all at once or each after the error of the one before, and reads the errors.
FLOOD_CLIENT = r"""
import asyncio, json, os, sys, websockets
count, url, at_once = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "at-once"  # else one at a time
mask = os.urandom(4)
payload = b'{"type":"response.nothing"}'
frame = bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

async def flood():
    async with websockets.connect(url, max_queue=None) as socket:
        if at_once:
            socket.transport.write(frame * count)
        for _ in range(count):
            if not at_once:
                socket.transport.write(frame)
            assert json.loads(await socket.recv())["type"] == "error"

asyncio.run(flood())
"""


class LoopHold:
    """An ASGI wrapper whose task on the server's loop measures the longest the loop went between two of its turns,
    in the CPU time of the server's thread: what other work held the loop, however busy the machine is."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and self._task is None:
            self._task = asyncio.create_task(self._watch())
        await self.app(scope, receive, send)

    async def _watch(self) -> None:
        while True:
            before = time.thread_time()
            await asyncio.sleep(0.001)
            self.longest = max(self.longest, time.thread_time() - before)


def test_a_flood_of_small_messages_holds_the_loop_no_longer_than_a_small_burst(vocab: Any) -> None:
    """20,000 small invalid messages written at once on one connection, against the control: a burst of 250 of them
    (about 8 KiB, one read). The longest the flood holds the event loop, in CPU time, is less than 3 times the
    burst's: how long the loop is held does not grow with the flood. Before, uvicorn parsed a whole read (up to
    256 KiB, ~7,000 frames) in one callback: 24-40 ms of CPU against 1-3 ms (/health waited 0.56-1.3 s against
    0.04 s quiet; the issue: 1.1 s against 0.12-0.15 s)."""
    from proxy.app import create_app
    from proxy.config import ServerConfig
    from proxy.engines.mock import mock_engine
    from proxy.server.sliced_websocket import SlicedWebSocketProtocol
    from proxy.state import ServerState

    held = LoopHold(create_app(ServerState(ServerConfig(), vocab, mock_engine(vocab, 0.0), None)))
    live = LiveServer(held, ws=SlicedWebSocketProtocol).start()
    url = live.base_url.replace("http://", "ws://") + "/v1/responses"
    holds = {}
    gc.collect()
    gc.freeze()  # as the server's command does once started (proxy/server/cli.py): the collector skips the vocabulary
    try:
        for name, mode, count in [("warm-up", "one-at-a-time", 200), ("burst", "at-once", 250),
                                  ("flood", "at-once", FLOOD)]:
            held.longest = 0.0
            subprocess.run([sys.executable, "-c", FLOOD_CLIENT, str(count), url, mode], check=True)
            holds[name] = held.longest
    finally:
        gc.unfreeze()
        live.stop()
    print(f"\nthe event loop held at most {holds['flood'] * 1000:.1f} ms (CPU) by {FLOOD} messages at once; "
          f"{holds['burst'] * 1000:.1f} ms by 250")
    assert holds["flood"] < 3 * holds["burst"]
