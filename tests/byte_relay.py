"""A loopback TCP relay that counts the bytes a server sends back: put between harmony-proxy and an upstream, it
measures what the upstream engine receives whatever its HTTP client (tests, benchmarks/upstream_ids_bench.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class ByteRelay:
    """Listens on a free loopback port (`url`) and forwards every connection to `host:port`; `received` counts the
    bytes that came back from there, over all connections."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._target = (host, port)
        self.received = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ByteRelay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._server.close()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, server_writer, count=False),
                             self._pipe(server_reader, client_writer, count=True))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool) -> None:
        try:
            while data := await reader.read(65536):
                if count:
                    self.received += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
