"""`EventStream`, the SSE response, as an ASGI application: frames, keep-alive pings, and a client leaving; and
`FrameWrites`, which writes every stream's frames of one turn of the event loop together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from proxy.frame_writes import FrameWrites
from proxy.sse import FRAME_WRITES, PING, RAW_SEND, EventStream


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


def scope(together: bool) -> dict[str, Any]:
    """Under KeepRawSend, streams share the app's FrameWrites; else each stream has its own."""
    return {"type": "http", FRAME_WRITES: FrameWrites()} if together else {"type": "http"}


@pytest.mark.parametrize("together", [False, True])
def test_pings_keep_an_idle_stream_open_and_stop_at_its_end(together: bool) -> None:
    async def main() -> Client:
        client, closed = Client(), []
        stream = EventStream(slow_frames(3, 0.12, closed), ping_interval=0.05)
        await stream(scope(together), client.receive, client.send)
        assert closed == [True]
        return client

    client = asyncio.run(main())
    bodies = client.bodies()
    assert [b for b in bodies if b != PING] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert bodies.count(PING) >= 4  # ~0.36 s at a ping every 0.05 s
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


@pytest.mark.parametrize("together", [False, True])
def test_frames_go_to_the_servers_own_send_when_it_is_kept(together: bool) -> None:
    async def main() -> tuple[Client, Client]:
        wrapped, raw = Client(), Client()
        stream = EventStream(slow_frames(2, 0, []))
        await stream({**scope(together), RAW_SEND: raw.send}, wrapped.receive, wrapped.send)
        return wrapped, raw

    wrapped, raw = asyncio.run(main())
    assert [m["type"] for m in wrapped.sent] == ["http.response.start"]
    assert raw.bodies() == [b"data: 0\n\n", b"data: 1\n\n", b""]


@pytest.mark.parametrize("together", [False, True])
def test_a_client_that_leaves_stops_the_frames_at_once(together: bool) -> None:
    async def main() -> tuple[Client, list[bool], float]:
        client, closed = Client(), []
        stream = EventStream(slow_frames(1000, 0.01, closed), ping_interval=0.02)
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, client.left.set)
        began = loop.time()
        await stream(scope(together), client.receive, client.send)
        return client, closed, loop.time() - began

    client, closed, took = asyncio.run(main())
    assert closed == [True]  # the frame iterator was closed: that is what cancels the engine request
    # Counted in frames, not seconds (the client left after ten frames' pauses on the same loop; the stream has 1000)
    frames = b"".join(m.get("body", b"") for m in client.sent).count(b"data: ")
    assert frames < 100, (frames, took)
    assert all(m.get("more_body", True) for m in client.sent)  # no end of response for nobody
    assert len(client.bodies()) < 100


def test_the_frames_of_one_turn_are_written_together_and_a_streams_own_are_joined() -> None:
    async def main() -> None:
        writes, log = FrameWrites(), []

        def recorder(name: str) -> Any:
            async def send(message: dict[str, Any]) -> None:
                log.append((name, message["body"]))
            return send

        a, b = writes.writer(recorder("a")), writes.writer(recorder("b"))
        a.queue(b"1")
        b.queue(b"x")
        a.queue(b"2")  # an engine that had two steps waiting: one write
        assert log == []  # nothing before the turn ends
        await asyncio.sleep(0)
        assert log == [("a", b"12"), ("b", b"x")]
        b.queue(b"y")
        await b.drain()  # written now, not at the end of the turn
        assert log[-1] == ("b", b"y")

    asyncio.run(main())


def test_a_client_that_stops_reading_holds_back_its_own_stream_only() -> None:
    async def main() -> None:
        writes, log = FrameWrites(), []
        readable = asyncio.get_running_loop().create_future()
        ended = []

        async def slow(message: dict[str, Any]) -> None:
            try:
                await readable  # as uvicorn waits for the socket to drain
                log.append(("slow", message["body"]))
            finally:
                ended.append(True)

        async def fast(message: dict[str, Any]) -> None:
            log.append(("fast", message["body"]))

        stalled, flowing = writes.writer(slow), writes.writer(fast)
        stalled.queue(b"s1")
        flowing.queue(b"f1")
        await asyncio.sleep(0)
        assert log == [("fast", b"f1")]
        assert stalled.waiting and not flowing.waiting
        flowing.queue(b"f2")
        await asyncio.sleep(0)
        assert log[-1] == ("fast", b"f2")  # the other stream goes on
        ready = asyncio.ensure_future(stalled.ready())
        await asyncio.sleep(0.01)
        assert not ready.done()  # its stream waits for the client before queueing more
        readable.set_result(None)
        await ready
        assert log[-1] == ("slow", b"s1") and not stalled.waiting

        blocked = asyncio.get_running_loop().create_future()

        async def never(message: dict[str, Any]) -> None:
            try:
                await blocked
            finally:
                ended.append(False)

        gone = writes.writer(never)
        gone.queue(b"z")
        await asyncio.sleep(0)
        gone.discard()  # the client left: the waiting write is dropped, its send ended
        await asyncio.sleep(0.01)
        assert ended == [True, False]

    asyncio.run(main())


def test_a_write_that_fails_is_raised_at_the_streams_next_frame() -> None:
    async def main() -> None:
        writes = FrameWrites()

        async def broken(message: dict[str, Any]) -> None:
            raise OSError("the connection is gone")

        writer = writes.writer(broken)
        writer.queue(b"x")
        await asyncio.sleep(0)
        assert writer.waiting
        with pytest.raises(OSError, match="gone"):
            await writer.ready()

    asyncio.run(main())
