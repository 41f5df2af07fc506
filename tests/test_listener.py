"""A burst of connections is accepted at once even while the loop is busy (proxy/listener.py)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from proxy.listener import Server, accept_eagerly

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


def test_the_server_serves_and_stops_with_eager_accept() -> None:
    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])

    async def main() -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        server = Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            replies = await asyncio.gather(*(client.get("/") for _ in range(50)))
        assert [reply.text for reply in replies] == ["hello"] * 50
        server.should_exit = True
        await serving
        listener.close()

    uvloop.run(main())
