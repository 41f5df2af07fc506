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
        self._writers: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ByteRelay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        """Close every open connection (their relays then end on their own) and stop listening."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._relays, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        writers = {client_writer}
        self._writers.add(client_writer)
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
            writers.add(server_writer)
            self._writers.add(server_writer)
            await asyncio.gather(self._pipe(client_reader, server_writer, count=False),
                                 self._pipe(server_reader, client_writer, count=True))
        except OSError:
            client_writer.close()
        finally:
            self._writers -= writers
            self._relays.discard(task)

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
