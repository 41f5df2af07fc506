"""How cheaply can the front end read an upstream's token stream? HTTP clients side by side, one run.

    .venv/bin/python benchmarks/upstream_client_bench.py                  # 64 streams, 1 and 8 events per write
    .venv/bin/python benchmarks/upstream_client_bench.py --streams 256 --events 400

A server (a subprocess on `--server-cpu`, asyncio on uvloop, nothing but pre-built bytes) answers each POST with a
chunked SSE stream of vLLM-shaped completion chunks (`--events` per request, `--batch` per write, the loop turning
between writes). The clients run in this process on `--client-cpu`, `--streams` at once, each request after the
last, and do what the upstream engine must: read the body, cut `data:` lines, decode the JSON, take the token ids.
Printed: this process's CPU per event (user + system) for each client, and its ratio to ours:

- ours: `proxy/engines/upstream/http.py` (httptools from `data_received`) and `chunks.py` beside it (msgspec);
- httpx: `httpx.AsyncClient.stream` + `aiter_bytes`, lines split and each decoded by the stdlib's json (the
  upstream engine before);
- aiohttp: `ClientSession.post` + `StreamResponse.content` (llhttp in C), its chunks split into lines, decoded by
  msgspec (only where aiohttp is installed: it is not a dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.engines.upstream.chunks import EventReader, decode
from proxy.engines.upstream.http import ConnectionPool, Origin, StreamEnded

CHUNK = ('{"id":"cmpl-0123456789abcdef","object":"text_completion","created":1764662400,"model":"openai/gpt-oss-20b",'
         '"choices":[{"index":0,"text":" word","token_ids":[%d],"logprobs":null,"finish_reason":null,'
         '"stop_reason":null}]}')


def serve(port: int, events: int, batch: int) -> None:
    """The server: each request's answer, pre-built, written `batch` events at a time."""
    lines = [b"data: " + (CHUNK % (1000 + index)).encode() + b"\n\n" for index in range(events)] + [b"data: [DONE]\n\n"]
    writes = []
    for start in range(0, len(lines), batch):
        data = b"".join(lines[start:start + batch])
        writes.append(b"%x\r\n%s\r\n" % (len(data), data))
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in request.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                writer.write(head)
                for data in writes:
                    writer.write(data)
                    await writer.drain()
                    await asyncio.sleep(0)
                writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


async def with_ours(url: str, streams: int, requests: int) -> int:
    pool = ConnectionPool(5, 60)
    origin = Origin(url)
    counted = 0

    async def client() -> None:
        nonlocal counted
        for _ in range(requests):
            connection = await pool.post(origin, "/completions", b'{"prompt":[1,2,3]}')
            events = EventReader()
            try:
                while True:
                    payloads = events.payloads(await connection.next_lines())
                    for chunk in decode(payloads) if payloads else ():
                        counted += len(chunk.choices[0].token_ids)
            except StreamEnded:
                pass
            connection.finish()

    await asyncio.gather(*(client() for _ in range(streams)))
    pool.close()
    return counted


async def with_httpx(url: str, streams: int, requests: int) -> int:
    import httpx

    counted = 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        async def client() -> None:
            nonlocal counted
            for _ in range(requests):
                async with http.stream("POST", url + "/completions", content=b'{"prompt":[1,2,3]}') as response:
                    buffer = b""
                    async for received in response.aiter_bytes():
                        *lines, buffer = (buffer + received).split(b"\n")
                        for raw in lines:
                            line = raw.rstrip(b"\r").decode()
                            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                                counted += len(json.loads(line[5:])["choices"][0]["token_ids"])

        await asyncio.gather(*(client() for _ in range(streams)))
    return counted


async def with_aiohttp(url: str, streams: int, requests: int) -> int:
    import aiohttp

    counted = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client() -> None:
            nonlocal counted
            for _ in range(requests):
                async with session.post(url + "/completions", data=b'{"prompt":[1,2,3]}') as response:
                    events, buffer = EventReader(), b""
                    async for received in response.content.iter_any():
                        buffer += received
                        cut = buffer.rfind(b"\n") + 1
                        if cut:
                            payloads = events.payloads(buffer[:cut])
                            buffer = buffer[cut:]
                            for chunk in decode(payloads) if payloads else ():
                                counted += len(chunk.choices[0].token_ids)

        await asyncio.gather(*(client() for _ in range(streams)))
    return counted


def measure(name: str, run: object, url: str, streams: int, requests: int) -> tuple[float, int]:
    start = os.times()
    began = time.monotonic()
    counted = uvloop.run(run(url, streams, requests))  # type: ignore[operator]
    end = os.times()
    cpu = (end.user - start.user) + (end.system - start.system)
    print(f"  {name:<8} {cpu / counted * 1e6:7.2f} us/event  ({counted} events, {time.monotonic() - began:.1f} s)",
          flush=True)
    return cpu / counted, counted


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--streams", type=int, default=64)
    options.add_argument("--events", type=int, default=400, help="events per request (default 400)")
    options.add_argument("--requests", type=int, default=4, help="requests per stream (default 4)")
    options.add_argument("--batch", type=lambda text: [int(part) for part in text.split(",")], default=[1, 8],
                         help="events per write, comma-separated (default 1,8)")
    options.add_argument("--server-cpu", type=int, default=1)
    options.add_argument("--client-cpu", type=int, default=0)
    args = options.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    clients = {"ours": with_ours, "httpx": with_httpx}
    try:
        import aiohttp  # noqa: F401

        clients["aiohttp"] = with_aiohttp
    except ImportError:
        print("aiohttp is not installed: not measured")
    for batch in args.batch:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(args.events), str(batch)],
                                  preexec_fn=lambda: os.sched_setaffinity(0, {args.server_cpu}))  # noqa: PLW1509
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port)).close()
                    break
                except OSError:
                    time.sleep(0.1)
            print(f"{args.streams} streams, {args.events} events per request, {batch} per write:")
            url = f"http://127.0.0.1:{port}/v1"
            costs = {name: measure(name, run, url, args.streams, args.requests)[0] for name, run in clients.items()}
            print("  " + ", ".join(f"{name} {cost / costs['ours']:.2f}x ours" for name, cost in costs.items()
                                   if name != "ours"))
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
