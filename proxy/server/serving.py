"""Serving `harmony-proxy serve`: build the server from the parsed options and serve, in one process or `--workers`
processes (`workers.py`), each of them an application of `create_app`. `cli.py` parses the command line and imports
this module only then; the server's state is built by `startup.py`.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import logging
import os
import resource
import shutil
import socket
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette

from parsers.vocab import VocabError
from proxy.app import create_app
from proxy.engines.scripted import ScriptError
from proxy.engines.trtllm.serve import TrtllmServeError, parse_trtllm_serve
from proxy.engines.vllm.serve import VllmServeError
from proxy.server import readiness
from proxy.server.arguments import StartupError, parse_command_line
from proxy.server.connections import ConnectionGuard, ConnectionLimits, default_max_connections, raise_descriptor_limit
from proxy.server.sliced_websocket import SlicedWebSocketProtocol
from proxy.server.startup import (
    TRTLLM_MAX_BATCH_SIZE,
    build_state,
    check_capacity,
    check_store,
    choose_store_path,
    engine_choice,
    trtllm_command,
    vllm_command,
)
from proxy.server.workers import ARGV_ENV, ENGINE_SOCKET_ENV, serve_workers
from proxy.state import ServerState
from proxy.telemetry.access_log import configure_logging
from proxy.validation import MAX_BODY_BYTES

logger = logging.getLogger("harmony_proxy")


def serve(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    """`harmony-proxy serve`, its options parsed (`argv`: the command line, the process's when None)."""
    configure_logging(args.log_level, args.log_format)
    raise_descriptor_limit()  # --workers processes inherit it
    loop, http = runtime()
    logger.info("event loop %s, HTTP parser %s, %d worker process%s", loop, http, args.workers,
                "" if args.workers == 1 else "es")
    arguments = list(sys.argv[1:] if argv is None else argv)
    temporary = None
    try:
        check_capacity(args)
        check_store(args)
        engine_name = engine_choice(args)
        temporary = choose_store_path(args, engine_name, arguments)
        if args.workers > 1:
            if engine_name == "trtllm":
                arguments += trtllm_worker_options(args)
            if engine_name == "vllm":
                arguments += vllm_worker_options(args)
            serve_workers(args, arguments, engine_name, uvicorn_options(args),
                          run_vllm_host if engine_name == "vllm" else run_trtllm_host)
            return
        listening = bind(args)  # before the engine starts: a port in use stops the server before anything loads
        state = build_state(args, engine_name)
        run_server(args, state, listening)
    except (StartupError, VocabError, ScriptError, TrtllmServeError, VllmServeError) as exc:
        print(f"harmony-proxy: error: {exc}", file=sys.stderr)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def trtllm_worker_options(args: argparse.Namespace) -> list[str]:
    """What the HTTP workers need from trtllm-serve's arguments, computed once by its own parsing before any process
    starts (its errors stop everything): the served name, and each worker's share of the engine's batch."""
    call = parse_trtllm_serve(trtllm_command(args))
    options = [] if args.served_model_name else ["--served-model-name", call.served_model_name]
    if args.max_concurrent_requests is None:
        batch = call.llm_args.get("max_batch_size") or TRTLLM_MAX_BATCH_SIZE
        options += ["--max-concurrent-requests", str(-(-batch // args.workers))]
    return options


def vllm_worker_options(args: argparse.Namespace) -> list[str]:
    """The served name the HTTP workers answer to, from vLLM's own parsing of the command, once, before any process
    starts (its errors stop everything)."""
    from proxy.engines.vllm.serve import parse_vllm_serve

    if args.served_model_name:
        return []
    parsed = parse_vllm_serve(vllm_command(args))
    return ["--served-model-name", parsed.served_model_name[0] if parsed.served_model_name else parsed.model]


def bind(args: argparse.Namespace) -> socket.socket:
    """The socket to serve on, bound: an address in use stops the start here (`proxy/server/readiness.py`)."""
    return readiness.bind(args.host, args.port)


def run_server(args: argparse.Namespace, state: ServerState, listening: socket.socket) -> None:
    failures: list[BaseException] = []

    def engine_failed(error: BaseException) -> None:
        failures.append(error)
        server.should_exit = True  # an engine that cannot start must not leave a server that answers 503 forever

    app = create_app(state, on_engine_failure=engine_failed)
    freeze_startup_objects()
    server = readiness.Server(uvicorn.Config(app, **uvicorn_options(args)))
    server.run(sockets=[listening])
    if failures:
        print(f"harmony-proxy: error: the {state.engine.name} engine failed to start: {failures[0]}", file=sys.stderr)
        raise SystemExit(1)


def worker_app() -> Starlette:
    """The application of one `--workers` process (uvicorn calls this factory in each, `proxy/server/workers.py`)."""
    args = parse_command_line(json.loads(os.environ[ARGV_ENV]))
    configure_logging(args.log_level, args.log_format)
    engine_name = engine_choice(args)
    engine = None
    if engine_name in ("trtllm", "vllm"):
        from proxy.engines.remote import RemoteEngine

        engine = RemoteEngine(os.environ[ENGINE_SOCKET_ENV], name=engine_name)
    app = create_app(build_state(args, engine_name, engine))
    freeze_startup_objects()
    return app


def run_trtllm_host(argv: list[str], socket_path: str) -> None:
    """The `--workers` engine host process's main function: the LLM is built in this process's main thread."""
    from proxy.engines.host import run_engine_host
    from proxy.engines.trtllm.engine import loaded_trtllm_engine

    args = parse_command_line(argv)
    configure_logging(args.log_level, args.log_format)
    build = functools.partial(loaded_trtllm_engine, trtllm_command(args), args.guided_decoding_backend,
                              args.host)
    run_engine_host(build, socket_path, args.log_level)


def run_vllm_host(argv: list[str], socket_path: str) -> None:
    """The `--workers` engine host process's main function: vLLM's engine client is built before its loop runs."""
    from proxy.engines.host import run_engine_host
    from proxy.engines.vllm.engine import loaded_vllm_engine

    args = parse_command_line(argv)
    configure_logging(args.log_level, args.log_format)
    run_engine_host(functools.partial(loaded_vllm_engine, vllm_command(args)), socket_path, args.log_level)


def freeze_startup_objects() -> None:
    """Keep the vocabulary tables and other start-up objects out of the collector's way: a full collection over
    them held the event loop 20-36 ms; after gc.freeze() about 3 ms (benchmarks/request_bench.py)."""
    gc.collect()
    gc.freeze()


def runtime() -> tuple[str, str]:
    """uvicorn's fast event loop and HTTP parser where installed (they are, by default), else its fallbacks."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return loop, http


def uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    loop, http = runtime()
    if loop == "uvloop":
        # uvloop that accepts every waiting connection (proxy/server/listener.py)
        loop = "proxy.server.listener:new_event_loop"
    limits = connection_limits(args)
    ws: Any = SlicedWebSocketProtocol  # websockets (sans I/O), parsed a slice at a time
    if http == "httptools":  # closes slow and idle connections, WebSockets too (proxy/server/connections.py)
        guard = ConnectionGuard(limits)
        http, ws = guard.protocol, guard.websocket_protocol
    return {"host": args.host, "port": args.port, "loop": loop, "http": http, "log_config": None,
            "log_level": args.log_level, "timeout_graceful_shutdown": args.shutdown_timeout,
            "timeout_keep_alive": limits.keep_alive_timeout,
            "access_log": False,  # ours (proxy/telemetry/access_log.py) has the request id, tokens and timings
            # WebSocket (proxy/responses/transport/websocket.py): the websockets library, its pings, and a message as
            # large as an HTTP body may be (a larger one closes the connection with 1009).
            "ws": ws, "ws_ping_interval": args.ws_ping_interval,
            "ws_ping_timeout": args.ws_ping_timeout, "ws_max_size": MAX_BODY_BYTES}


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    cap = args.max_connections
    if cap is None:
        cap = default_max_connections(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    return ConnectionLimits(args.request_head_timeout, args.request_body_timeout, args.keep_alive_timeout, cap)
