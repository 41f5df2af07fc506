"""The kernel's floor under the token path: server CPU per frame written to a loopback TCP connection.

    .venv/bin/python benchmarks/send_floor.py                 # 1 and 64 connections, 300-byte frames
    .venv/bin/python benchmarks/send_floor.py --connections 64 --frame-bytes 250 --frames 200000

With one frame per token, each token costs the server one `send` on its client's socket whatever the server is
written in: this measures that cost alone, nothing of HTTP, JSON or parsing. The writer runs on `--server-cpu`,
reader processes (one per 16 connections, reading as fast as they can, as the load benchmark's client does) on
`--client-cpu`. Frames go round-robin over the connections, a turn of the event loop after each round (as
the server writes one frame per stream per engine step), two ways, side by side:
- os.write: the bare system call from Python;
- transport.write: uvloop's transport, which the server's frames go through (uvicorn's `send`).
Printed: user and system CPU microseconds per frame of this process, and frames per second.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import resource
import socket
import time

import uvloop


def read_forever(sockets: list[socket.socket]) -> None:
    import selectors

    selector = selectors.DefaultSelector()
    for sock in sockets:
        selector.register(sock, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if not key.fileobj.recv(1 << 20):  # type: ignore[union-attr]
                return


def connected_pairs(count: int) -> list[tuple[socket.socket, socket.socket]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(count)
    pairs = []
    for _ in range(count):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvloop and uvicorn set it
        server.setblocking(False)
        pairs.append((server, client))
    listener.close()
    return pairs


def start_readers(pairs: list[tuple[socket.socket, socket.socket]], cpu: int) -> list[int]:
    clients, pids = [client for _, client in pairs], []
    for start in range(0, len(clients), 16):
        pid = os.fork()
        if pid == 0:
            for server, _ in pairs:
                server.close()  # or the connection never ends for the reader
            os.sched_setaffinity(0, {cpu})
            read_forever(clients[start:start + 16])
            os._exit(0)
        pids.append(pid)
    return pids


async def write_frames(way: str, servers: list[socket.socket], frame: bytes, frames: int) -> tuple[float, float, float]:
    loop = asyncio.get_running_loop()
    transports: list[asyncio.Transport] = []
    if way == "transport.write":
        for sock in servers:
            transport, _ = await loop.create_connection(asyncio.Protocol, sock=sock)
            transports.append(transport)  # type: ignore[arg-type]
        writers = [transport.write for transport in transports]
    else:
        for sock in servers:
            sock.setblocking(True)  # a reader that falls behind makes us wait, not fail
        writers = [functools.partial(os.write, sock.fileno()) for sock in servers]
    rounds = max(1, frames // len(writers))
    before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(rounds):
        for write in writers:
            write(frame)
        await asyncio.sleep(0)
    after, took = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - began
    for transport in transports:
        transport.close()
    await asyncio.sleep(0.1)  # the transports close on the loop
    count = rounds * len(writers)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return user / count * 1e6, system / count * 1e6, count / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", default="1,64", help="comma-separated connection counts")
    parser.add_argument("--frame-bytes", type=int, default=300, help="a chat chunk's SSE frame is ~250-300 bytes")
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    args = parser.parse_args()
    frame = b"x" * args.frame_bytes
    print(f"writer on CPU {args.server_cpu}, readers on CPU {args.client_cpu}; {args.frame_bytes}-byte frames")
    print(f"{'connections':>11} {'way':>16} {'user us':>8} {'sys us':>8} {'total us':>9} {'frames/s':>10}")
    for count in (int(c) for c in args.connections.split(",")):
        for way in ("os.write", "transport.write"):
            pairs = connected_pairs(count)
            readers = start_readers(pairs, args.client_cpu)
            for _, client in pairs:
                client.close()  # the readers hold their copies
            os.sched_setaffinity(0, {args.server_cpu})
            user, system, rate = uvloop.run(write_frames(way, [server for server, _ in pairs], frame, args.frames))
            for server, _ in pairs:
                server.close()
            for pid in readers:
                os.waitpid(pid, 0)
            os.sched_setaffinity(0, {args.server_cpu, args.client_cpu})
            print(f"{count:>11} {way:>16} {user:>8.2f} {system:>8.2f} {user + system:>9.2f} {rate:>10.0f}")


if __name__ == "__main__":
    main()
