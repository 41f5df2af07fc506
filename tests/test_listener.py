"""A burst of connections is accepted at once even while the loop is busy (proxy/server/listener.py)."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from proxy.server.listener import accept_eagerly, new_event_loop
from tests.waiting import eventually

BURST = 300
BUSY_TASKS = 300


def test_a_burst_is_accepted_within_a_few_busy_iterations() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        accepted: list[int] = []
        iterations = 0
        stop = False

        class Counting(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.append(iterations)

        async def busy() -> None:  # streams that are always ready, as at 1,000 streams under load
            while not stop:
                await asyncio.sleep(0)

        async def count_iterations() -> None:
            nonlocal iterations
            while not stop:
                iterations += 1
                await asyncio.sleep(0)

        server = await loop.create_server(Counting, "127.0.0.1", 0, backlog=2048)
        stop_accepting = accept_eagerly(server.sockets[0], Counting)
        tasks = [asyncio.create_task(busy()) for _ in range(BUSY_TASKS)]
        tasks.append(asyncio.create_task(count_iterations()))
        await asyncio.sleep(0.05)
        clients = []
        for _ in range(BURST):  # the kernel completes each handshake; the server's loop has to accept them
            client = socket.socket()
            client.setblocking(False)
            try:
                client.connect(server.sockets[0].getsockname())
            except BlockingIOError:
                pass
            clients.append(client)
        start = iterations
        for _ in range(200):
            if len(accepted) >= BURST:
                break
            await asyncio.sleep(0)
        stop = True
        await asyncio.gather(*tasks)
        stop_accepting()
        server.close()
        for client in clients:
            client.close()
        assert len(accepted) == BURST
        # uvloop alone takes one connection per iteration here (300 iterations); drained, a few iterations do.
        assert max(accepted) - start <= 10

    uvloop.run(main())


def test_uvicorn_serves_on_the_eager_loop() -> None:
    async def loop_name(request: object) -> PlainTextResponse:
        return PlainTextResponse(type(asyncio.get_running_loop()).__name__)

    app = Starlette(routes=[Route("/", loop_name)])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    address = listener.getsockname()
    # What the CLI gives uvicorn (proxy/server/cli.py uvicorn_options), in one process or in each worker.
    server = uvicorn.Server(uvicorn.Config(app, loop="proxy.server.listener:new_event_loop", log_level="warning",
                                           lifespan="off"))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [listener]})
    serving.start()
    try:
        eventually(lambda: server.started, still=serving.is_alive, why="uvicorn ended before it started")
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
            assert {client.get("/").text for _ in range(20)} == {"EagerAcceptLoop"}
    finally:
        server.should_exit = True
        serving.join(10)
        listener.close()


def test_closing_a_server_of_the_eager_loop_stops_accepting_at_once() -> None:
    """uvicorn closes its servers first when it shuts down; the duplicate socket must not go on accepting."""

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        socket.create_connection(address, timeout=2).close()  # accepted while serving
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=2).close()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
