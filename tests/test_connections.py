"""Slow and idle connections are closed, open connections are capped, long streams are not touched
(proxy/server/connections.py), on the real server process the CLI starts."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import MODEL
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
CAP = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_process(tmp_path_factory.mktemp("connections"), "--request-head-timeout", "1",
                             "--request-body-timeout", "1.5", "--keep-alive-timeout", "0.5", "--max-connections",
                             str(CAP))


def serve_process(folder: Path, *options: str) -> Iterator[str]:
    """The CLI's server with the mock engine, its URL until the generator is closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = folder / "server.log"
    command = [sys.executable, "-m", "proxy", "serve", "--engine", "mock", "--host", "127.0.0.1", "--port", str(port),
               "--no-store", "--token-delay-ms", "40", *options]
    with log.open("ab") as output:
        process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=output)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:  # as long as it runs: a start takes seconds, more on a busy machine
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=5)
    connection.setblocking(False)
    return connection


def is_closed(connection: socket.socket) -> bool:
    """Whether the server closed it (what it sent before closing is read and ignored)."""
    try:
        while data := connection.recv(65536):
            del data
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


class ControlStream:
    """Streamed answers from the mock (--token-delay-ms 40: about 2 s each) in a thread: the control. The server's
    connection timeouts (1 to 1.5 s) run on the same event loop as the mock's token steps, so a busy machine delays
    both alike: a connection the timeouts close is closed while the control still streams."""

    def __init__(self, url: str, answers: int = 2) -> None:
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._stream, args=(url, answers), daemon=True)
        self._thread.start()

    def _stream(self, url: str, answers: int) -> None:
        body = {"model": "openai/gpt-oss-20b", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        try:
            with httpx.Client(base_url=url, timeout=None) as client:
                for _ in range(answers):
                    with client.stream("POST", "/v1/chat/completions", json=body) as response:
                        for _ in response.iter_lines():
                            pass
        finally:
            self.done.set()

    def streaming(self) -> bool:
        return not self.done.is_set()


def test_silent_slow_header_and_slow_body_connections_are_closed(server: str) -> None:
    silent = [connect(server) for _ in range(10)]
    slow_head = connect(server)
    slow_head.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    slow_body = connect(server)
    slow_body.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\n\r\n{\"model\":")
    trickle = connect(server)  # a byte of its head every 0.3 s: never complete
    control = ControlStream(server)
    for byte in b"GET /health HTTP/1.1\r\n":
        if is_closed(trickle) or not control.streaming():
            break
        trickle.send(bytes([byte]))
        time.sleep(0.3)
    everything = [*silent, slow_head, slow_body, trickle]
    eventually(lambda: all(is_closed(c) for c in everything), still=control.streaming, interval=0.05)
    for connection in everything:
        connection.close()


def test_an_idle_keep_alive_connection_is_closed_after_its_response(server: str) -> None:
    connection = connect(server)
    connection.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    eventually(lambda: connection.recv(65536).startswith(b"HTTP/1.1 200") if readable(connection) else False)
    control = ControlStream(server, answers=1)
    eventually(lambda: is_closed(connection), still=control.streaming, interval=0.05)
    connection.close()


def readable(connection: socket.socket) -> bool:
    return bool(select.select([connection], [], [], 0)[0])


def test_idle_sockets_are_shed_before_a_new_client_is_refused(tmp_path: Path) -> None:
    """Its own server, with the default request-head deadline (far longer than the test): the 1 s one of the shared
    server would close the newest sockets too on a machine slow enough, and this test is about shedding alone."""
    processes = serve_process(tmp_path, "--max-connections", str(CAP))
    server = next(processes)
    try:
        idle = [connect(server) for _ in range(CAP * 2)]
        time.sleep(0.3)
        # With twice the cap held open, new clients are served all the same: the oldest idle sockets made room.
        with httpx.Client(base_url=server, timeout=5) as client:
            for _ in range(5):
                assert client.get("/health").status_code == 200
        assert sum(is_closed(c) for c in idle) >= CAP
        assert sum(is_closed(c) for c in idle[-CAP // 2:]) == 0  # the newest were kept, the oldest shed
        for connection in idle:
            connection.close()
    finally:
        processes.close()


def test_a_stream_longer_than_every_timeout_is_not_cut(server: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a long story " * 10}], "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in data[:-1]]
    assert time.monotonic() - started > 2.5  # longer than the head, body and keep-alive timeouts together
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_websocket_idle_longer_than_every_timeout_stays_open(server: str) -> None:
    """The WebSocket protocol owns an upgraded connection: no request-head deadline follows it there."""

    async def session() -> list[str]:
        url = server.replace("http://", "ws://") + "/v1/responses"
        async with websockets.connect(url) as socket_:
            types = []
            for pause in (0, 2.5):  # idle longer than the head, body and keep-alive timeouts together
                await asyncio.sleep(pause)
                await socket_.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                               "store": False}))
                while (event := json.loads(await socket_.recv()))["type"] != "response.completed":
                    pass
                types.append(event["type"])
            return types

    assert asyncio.run(session()) == ["response.completed", "response.completed"]


def test_idle_websockets_are_shed_like_idle_keep_alive_connections(tmp_path: Path) -> None:
    """64 upgraded connections with nothing in flight, answering the server's pings, at `--max-connections 64`:
    before, every new /health was a 503. Now the idle WebSockets that waited longest are closed (1013, try again
    later) for new clients; one with a response running is never shed."""
    cap = 64
    processes = serve_process(tmp_path, "--max-connections", str(cap), "--ws-ping-interval", "0.2")
    server = next(processes)
    url = server.replace("http://", "ws://") + "/v1/responses"
    story = {"type": "response.create", "model": MODEL, "input": "tell me a long story " * 10, "store": False}

    async def session() -> tuple[list[int], list[int | None], str]:
        busy = await websockets.connect(url)
        await busy.send(json.dumps(story))
        assert json.loads(await busy.recv())["type"] == "response.created"
        idle = [await websockets.connect(url) for _ in range(cap - 1)]
        await asyncio.sleep(0.5)  # pings sent and answered meanwhile
        statuses = []
        async with httpx.AsyncClient(base_url=server, timeout=10) as client:
            for _ in range(5):
                statuses.append((await client.get("/health")).status_code)
            for _ in range(3):
                answer = await client.post("/v1/responses", json={"model": MODEL, "input": "hi", "store": False})
                statuses.append(answer.status_code)
        await asyncio.sleep(0.2)
        codes = [socket_.close_code for socket_ in idle]
        while (event := json.loads(await busy.recv()))["type"] != "response.completed":
            pass
        for socket_ in [busy, *idle]:
            await socket_.close()
        return statuses, codes, event["type"]

    try:
        statuses, codes, last = asyncio.run(session())
    finally:
        processes.close()
    assert statuses == [200] * 8
    shed = [code for code in codes if code is not None]
    assert shed and set(shed) == {1013}
    assert codes[-cap // 2:] == [None] * (cap // 2)  # the oldest idle ones went first
    assert last == "response.completed"  # the connection with a response running was kept
