"""The engine host: one process that owns the engine and serves it to HTTP front-end processes.

With several workers and the in-process TensorRT-LLM engine, the supervisor starts this process, then the front
ends, whose engine is `RemoteEngine(socket_path)` (remote.py). The engine is built first, synchronously, in the
process's main thread before any event loop runs (for TensorRT-LLM, `tensorrt_llm.LLM(**arguments)`, as
trtllm-serve does: its MPI start-up and signal handling assume the main thread). Only then does the Unix socket
accept connections, so until the model has loaded the front ends are not ready and answer /health with 503.

Each front end holds one connection carrying all its requests (wire.py has the frames). A request runs as one
task iterating the engine's generator; the front end's CANCEL, or its connection dropping (the process died),
cancels that task, which closes the generator: the engine aborts the request. SIGTERM or SIGINT ends the host:
running requests fail with a 503, connections close, and the engine is closed (`llm.shutdown()`).

A front end is checked as any client is: a frame longer than a request can be (`MAX_REQUEST_BYTES`) closes its
connection at its header, before anything of it is buffered, and what a connection buffered goes when it closes. A
request with a token id outside the engine's vocabulary, or asking for more tokens than its context window holds,
fails with a 400 before the engine sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from collections.abc import Callable
from typing import cast

from proxy.engines import wire
from proxy.engines.base import Engine, EngineError, GenerationRequest, Step

logger = logging.getLogger("harmony_proxy.engine_host")

SHUTDOWN_GRACE = 10.0  # seconds cancelled requests get to release their engine slots before the engine closes
# The longest frame a front end may send: a request's fields (its tools' schemas: an HTTP body is at most 8 MiB,
# escaped as JSON) and its prompt (4 bytes a token).
MAX_REQUEST_BYTES = 64 << 20


def run_engine_host(
    build: Callable[[], Engine], socket_path: str | os.PathLike[str], log_level: str | None = None
) -> None:
    """Build the engine in this (main) thread, then serve it on `socket_path` until SIGTERM or SIGINT.

    Call it as a process's main function (a spawned process: it configures logging at `log_level` when given).
    It raises what `build` raises; it returns once the engine is closed.
    """
    if log_level is not None:
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # SIGTERM while the model loads unwinds the process, so atexit clean-up (TensorRT-LLM's MPI session) runs.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    engine = build()
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve_until_signalled(engine, os.fspath(socket_path)))


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


async def _serve_until_signalled(engine: Engine, socket_path: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve_engine(engine, socket_path, stop)


async def serve_engine(engine: Engine, socket_path: str, stop: asyncio.Event) -> None:
    """Start `engine`, serve it on `socket_path` until `stop` is set, then close it."""
    connections: set[_Connection] = set()
    server, inode = None, 0
    try:
        await engine.start()  # nothing left to do for an engine its build loaded
        listening = _listening_socket(socket_path)
        inode = os.stat(socket_path).st_ino
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: _Connection(engine, connections), sock=listening
        )
        logger.info("engine host: the %s engine is serving front ends on %s", engine.name, socket_path)
        await stop.wait()
        logger.info("engine host: stopping")
    finally:
        if server is not None:
            server.close()
        running = [task for connection in list(connections) for task in connection.shut_down()]
        if running:
            await asyncio.wait(running, timeout=SHUTDOWN_GRACE)
        await engine.close()
        if server is not None:
            _remove_socket(socket_path, inode)


class _Connection(asyncio.Protocol):
    """One front end: its requests, each a task, by the handle the front end gave it."""

    def __init__(self, engine: Engine, registry: set[_Connection]) -> None:
        self._engine = engine
        self._registry = registry
        self._requests: dict[int, asyncio.Task[None]] = {}
        self._health_checks: set[asyncio.Task[None]] = set()
        self._reader = wire.FrameReader(self._received, MAX_REQUEST_BYTES)
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self._writer = wire.FrameWriter(self._transport)
        self._registry.add(self)
        self._writer.send(wire.hello_frame(self._engine.name, getattr(self._engine, "context_window", None),
                                           getattr(self._engine, "kv_event_sources", None)))

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except Exception:
            logger.exception("engine host: a front end sent what is not a frame; closing its connection")
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._reader.close()
        self._registry.discard(self)
        if self._requests:
            logger.warning("engine host: a front end went away; cancelling its %d requests", len(self._requests))
        for task in self._requests.values():
            task.cancel()

    def shut_down(self) -> list[asyncio.Task[None]]:
        """Fail this front end's running requests with a 503 and close the connection; returns their tasks."""
        tasks = list(self._requests.values())
        for handle, task in self._requests.items():
            closing = EngineError(f"The {self._engine.name} engine is shutting down.", 503, "engine_shutting_down")
            self._writer.send(wire.error_frame(handle, closing))
            task.cancel()
        self._writer.flush()
        self._transport.close()
        return tasks

    def _received(self, kind: int, handle: int, data: bytes, start: int, end: int) -> None:
        if kind == wire.SUBMIT:
            if handle in self._requests:
                raise wire.ProtocolError(f"request handle {handle} is already running")
            request = wire.read_request(data[start:end])
            refusal = _refusal(request, self._engine)
            if refusal is not None:
                self._writer.send(wire.error_frame(handle, refusal))
                return
            self._requests[handle] = self._loop.create_task(self._run(handle, request))
        elif kind == wire.CANCEL:
            task = self._requests.get(handle)
            if task is not None:  # else it finished meanwhile
                task.cancel()
        elif kind == wire.HEALTH:
            check = self._loop.create_task(self._check_health(handle))
            self._health_checks.add(check)
            check.add_done_callback(self._health_checks.discard)
        else:
            raise wire.ProtocolError(f"unknown frame kind {kind}")

    async def _run(self, handle: int, request: GenerationRequest) -> None:
        send = self._writer.send
        steps = self._engine.generate(request)
        try:
            async for step in steps:
                if step.finish_reason is not None:
                    send(wire.last_frame(handle, step))
                    return
                send(wire.step_frame(handle, step.token_ids))
            send(wire.last_frame(handle, Step(())))  # ended without a finish reason
        except EngineError as exc:
            send(wire.error_frame(handle, exc))
        except Exception:  # not CancelledError: that is the front end cancelling, and nobody waits for an answer
            logger.exception("engine host: request %s: the %s engine failed", request.request_id, self._engine.name)
            failed = EngineError(f"The {self._engine.name} engine failed unexpectedly.", 500, "engine_error")
            send(wire.error_frame(handle, failed))
        finally:
            del self._requests[handle]
            await steps.aclose()  # after a finish step or an error; after a cancel it is closed already

    async def _check_health(self, handle: int) -> None:
        try:
            await self._engine.check_health()
        except EngineError as exc:
            self._writer.send(wire.error_frame(handle, exc))
        else:
            self._writer.send(wire.frame(wire.HEALTHY, handle))


def _refusal(request: GenerationRequest, engine: Engine) -> EngineError | None:
    """What the engine must not be asked, as the HTTP routes check it: token ids outside its vocabulary (when the
    engine says its size), more tokens than its context window (when built)."""
    vocab_size: int | None = getattr(engine, "vocab_size", None)
    if vocab_size is not None:
        highest = max(request.prompt_token_ids, default=0)  # unsigned on the wire
        if highest >= vocab_size:
            return EngineError(f"Token id {highest} is out of vocabulary (the vocabulary has {vocab_size} tokens).",
                               400, "invalid_token_id")
    window = getattr(engine, "context_window", None)
    max_tokens = request.sampling.max_tokens
    limit = window.total if window is not None else wire.MAX_TOKENS
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= limit:
        return EngineError(f"max_tokens must be from 1 to {limit} (the context window); got {max_tokens!r}.", 400,
                           "context_length_exceeded")
    return None


def _listening_socket(path: str) -> socket.socket:
    """A socket bound at `path`, readable by this user only, not yet listening."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)  # left by a host that died; a live one would be a supervisor's mistake
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listening.bind(path)
        os.chmod(path, 0o600)  # before listen(): until then connections are refused
    except BaseException:
        listening.close()
        raise
    return listening


def _remove_socket(path: str, inode: int) -> None:
    """Remove the socket file, unless another host has bound the path since."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
