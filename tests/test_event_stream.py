"""`EventStream`, the SSE response, as an ASGI application: frames, keep-alive pings, and a client leaving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from proxy.sse import PING, RAW_SEND, EventStream


class Client:
    """The server's side of one connection: what was sent, and a `receive` that reports a disconnect on demand."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        assert not self.sent or self.sent[-1].get("more_body", True), "a message after the end of the response"
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def slow_frames(count: int, pause: float, closed: list[bool]) -> AsyncGenerator[bytes, None]:
    try:
        for n in range(count):
            await asyncio.sleep(pause)
            yield b"data: %d\n\n" % n
    finally:
        closed.append(True)


def test_pings_keep_an_idle_stream_open_and_stop_at_its_end() -> None:
    async def main() -> Client:
        client, closed = Client(), []
        stream = EventStream(slow_frames(3, 0.12, closed), ping_interval=0.05)
        await stream({"type": "http"}, client.receive, client.send)
        assert closed == [True]
        return client

    client = asyncio.run(main())
    bodies = client.bodies()
    assert [b for b in bodies if b != PING] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert bodies.count(PING) >= 4  # ~0.36 s at a ping every 0.05 s
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_frames_go_to_the_servers_own_send_when_it_is_kept() -> None:
    async def main() -> tuple[Client, Client]:
        wrapped, raw = Client(), Client()
        stream = EventStream(slow_frames(2, 0, []))
        await stream({"type": "http", RAW_SEND: raw.send}, wrapped.receive, wrapped.send)
        return wrapped, raw

    wrapped, raw = asyncio.run(main())
    assert [m["type"] for m in wrapped.sent] == ["http.response.start"]
    assert raw.bodies() == [b"data: 0\n\n", b"data: 1\n\n", b""]


def test_a_client_that_leaves_stops_the_frames_at_once() -> None:
    async def main() -> tuple[Client, list[bool], float]:
        client, closed = Client(), []
        stream = EventStream(slow_frames(1000, 0.01, closed), ping_interval=0.02)
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, client.left.set)
        began = loop.time()
        await stream({"type": "http"}, client.receive, client.send)
        return client, closed, loop.time() - began

    client, closed, took = asyncio.run(main())
    assert closed == [True]  # the frame iterator was closed: that is what cancels the engine request
    assert took < 1.0
    assert all(m.get("more_body", True) for m in client.sent)  # no end of response for nobody
    assert len(client.bodies()) < 100
