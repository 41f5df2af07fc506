"""From the options to a server's state: the engine, the admission queue, the store, the settings, tracing.

Everything here runs before anything is served; a problem is a `StartupError`, said in one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from parsers.vocab import Vocab, load_vocab
from proxy.admission import AdmissionQueue, AdmittedEngine
from proxy.browsers import allowed_hosts
from proxy.config import ServerConfig
from proxy.engines.base import Engine
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import read_script, scripted_engine
from proxy.responses.sealing import KEY_ENV, MIN_SECRET_CHARS
from proxy.server.arguments import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONTEXT,
    DEFAULT_MODEL,
    StartupError,
    default_store_path,
)
from proxy.server_tools.allow import McpAllowList, McpUrlRefused, parse_target
from proxy.state import ServerState
from proxy.store.base import OnOperation, ResponseStore, StoreUnavailable
from proxy.store.sqlite import SQLiteResponseStore
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import TracedEngine, traced_store_operations, tracer_from_environment

logger = logging.getLogger("harmony_proxy")
TRTLLM_MAX_BATCH_SIZE = 2048  # trtllm-serve's default --max_batch_size


def choose_store_path(args: argparse.Namespace, engine_name: str, argv: list[str]) -> Path | None:
    """Where responses are stored when --store-path is not given: the user's data folder for a real model; for
    the mock and scripted engines, which people try and test with, a temporary folder (returned, for removal
    when the server stops; workers are told the path through `argv`). Says in the log where responses go."""
    if args.no_store:
        logger.info("storing no responses (--no-store)")
        return None
    if args.store_url:
        logger.info("storing responses in PostgreSQL at %s", _without_password(args.store_url))
        if args.reasoning_key is None:
            logger.warning("replicas sharing this store need one --reasoning-key (or %s), or a sealed blob made by "
                           "one does not open on the others", KEY_ENV)
        return None
    if args.store_path is not None or engine_name not in ("mock", "scripted"):
        logger.info("storing responses in %s", args.store_path or default_store_path())
        return None
    folder = Path(tempfile.mkdtemp(prefix="harmony-proxy-store-"))
    # uvicorn hands SIGTERM on once it has shut down: end by SystemExit then, so the folder is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args.store_path = folder / "responses.sqlite3"
    argv += ["--store-path", str(args.store_path)]
    logger.info("storing responses in %s until the server stops (--store-path to keep them)", args.store_path)
    return folder


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}{parts.hostname or ''}{port}", parts.path, "", ""))


def build_state(args: argparse.Namespace, engine_name: str, engine: Engine | None = None) -> ServerState:
    """Everything a server process needs; `engine` replaces the one the options name (a worker's remote engine)."""
    vocab = load_vocab()
    if engine is None:
        engine = _build_engine(engine_name, args, vocab)
    config = server_config(args, engine_name, getattr(engine, "served_model_name", None))
    metrics = Metrics(config.served_model_name, engine.name, config.max_model_len)
    if engine_name == "vllm" and args.workers == 1:
        import prometheus_client  # vLLM's engine statistics (vllm:num_requests_running...) live in its default registry

        metrics.engine_registry = prometheus_client.REGISTRY
    try:
        tracer = tracer_from_environment()
    except (ValueError, ImportError) as exc:
        raise StartupError(f"tracing: {exc}") from None
    on_store_operation = metrics.store_operation
    if tracer is not None:
        engine = TracedEngine(engine)  # inside admission: the engine span starts once the request is admitted
        on_store_operation = traced_store_operations(on_store_operation)
    batch = getattr(engine, "call", None) and engine.call.llm_args.get("max_batch_size")
    engine = AdmittedEngine(engine, admission_queue(args, engine_name, metrics, batch))
    return ServerState(config, vocab, engine, open_store(args, on_store_operation), metrics, tracer)


def check_store(args: argparse.Namespace) -> None:
    """A PostgreSQL store that cannot be reached stops the start with psycopg's reason, in one line, before any
    worker or engine starts (the server cannot serve its stored responses without it)."""
    if args.no_store or args.store_path is not None or not (args.store_url or "").startswith(("postgresql://", "postgres://")):
        return  # nothing to reach, or `open_store` refuses the options
    from proxy.store.postgres_connection import check_reachable  # psycopg, loaded only when used

    try:
        check_reachable(args.store_url)
    except StoreUnavailable as exc:
        raise StartupError(str(exc)) from None


def open_store(args: argparse.Namespace, on_operation: OnOperation) -> ResponseStore | None:
    """The store the options name: none, PostgreSQL (connected when the server starts), or the SQLite file."""
    if args.no_store:
        return None
    if args.store_url:
        if args.store_path is not None:
            raise StartupError("--store-url and --store-path name two stores: give one")
        if not args.store_url.startswith(("postgresql://", "postgres://")):
            raise StartupError("--store-url takes a PostgreSQL URL: postgresql://user:password@host:port/database")
        from proxy.store.postgres import PostgresResponseStore  # psycopg, loaded only when used

        return PostgresResponseStore(args.store_url, on_operation)
    path = args.store_path or default_store_path()
    try:
        return SQLiteResponseStore(path, on_operation)
    except (OSError, sqlite3.Error) as exc:
        raise StartupError(f"cannot open the response store {path}: {exc}") from None


def admission_queue(
    args: argparse.Namespace, engine_name: str, metrics: Metrics | None = None, max_batch_size: int | None = None
) -> AdmissionQueue:
    """The admission limits of one server process (with no limit, the queue still counts running requests)."""
    on_change = metrics.admission_changed if metrics is not None else None
    limit = args.max_concurrent_requests
    if limit is None:
        if engine_name == "trtllm":
            # One engine serves every worker: its batch is shared among them.
            limit = -(-(max_batch_size or TRTLLM_MAX_BATCH_SIZE) // args.workers)
        else:
            limit = DEFAULT_CONCURRENCY
    if limit == 0:
        logger.info("admitting any number of requests at once")
        return AdmissionQueue(sys.maxsize, 0, on_change)
    queue = AdmissionQueue(limit, limit if args.max_queue is None else args.max_queue, on_change)
    logger.info("admitting %d requests at once%s, %d more in line, then 429", limit,
                " per worker" if args.workers > 1 else "", queue.max_queue)
    return queue


def check_capacity(args: argparse.Namespace) -> None:
    if args.workers < 1:
        raise StartupError("--workers must be at least 1")
    if args.max_concurrent_requests is not None and args.max_concurrent_requests < 0:
        raise StartupError("--max-concurrent-requests must be 0 (no limit) or more")
    if args.max_queue is not None and args.max_queue < 0:
        raise StartupError("--max-queue must be 0 or more")
    if args.max_connections is not None and args.max_connections < 0:
        raise StartupError("--max-connections must be 0 (no cap) or more")
    for flag in ("request_head_timeout", "request_body_timeout", "keep_alive_timeout"):
        _at_least("--" + flag.replace("_", "-"), getattr(args, flag), 0.001)


def engine_choice(args: argparse.Namespace) -> str:
    model = args.trtllm_serve[0] if args.trtllm_serve else None
    if args.engine:
        name = args.engine
    elif args.upstream_url:
        name = "upstream"
    elif importlib.util.find_spec("tensorrt_llm") is not None:
        name = "trtllm"
    else:
        if model:
            raise StartupError(f"{' '.join(args.trtllm_serve)}: a trtllm-serve command line needs TensorRT-LLM, "
                               "which is not installed here: install harmony-proxy[trtllm] on a CUDA machine, or "
                               "pass --engine mock")
        logger.info("no --engine given and TensorRT-LLM is not installed: serving the built-in MOCK engine "
                    "(no model weights; answers are placeholders)")
        return "mock"
    logger.info("serving with the %s engine%s", name, f" ({model})" if model and name in ("trtllm", "vllm") else "")
    return name


def _listed(values: Sequence[str]) -> tuple[str, ...]:
    """Repeated options, each of which may also be a comma-separated list."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _mcp_allow(prefixes: Sequence[str]) -> tuple[str, ...]:
    try:
        McpAllowList(prefixes)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    return tuple(prefixes)


def _at_least(flag: str, value: float, least: float) -> Any:
    if not value >= least:
        raise StartupError(f"{flag} must be at least {least:g}")
    return value


def _tool_servers(urls: Sequence[str]) -> tuple[str, ...]:
    """The --tool-server URLs, normalized; they are the operator's own, so no --mcp-allow applies to them."""
    try:
        return tuple(parse_target(url)[1] for url in urls)
    except McpUrlRefused as exc:
        raise StartupError(f"--tool-server: {exc}") from None


def server_config(args: argparse.Namespace, engine_name: str, engine_model: str | None = None) -> ServerConfig:
    """The settings; `engine_model` is the name the engine serves under (trtllm-serve's), when it has one."""
    return ServerConfig(
        served_model_name=args.served_model_name or engine_model or DEFAULT_MODEL,
        reasoning_field=args.reasoning_field,
        default_reasoning_effort=args.default_reasoning_effort,
        max_model_len=args.max_model_len or DEFAULT_CONTEXT,  # the engine's, once started, where less
        api_key=args.api_key,
        metrics_public=args.metrics_public,
        allowed_hosts=allowed_hosts(args.host, _listed(args.allowed_hosts)),
        allowed_origins=_listed(args.allowed_origins),
        log_requests=args.log_requests,
        drain_seconds=args.drain_seconds,
        max_tools=args.max_tools,
        max_tools_schema_bytes=args.max_tools_schema_bytes,
        reasoning_summary_events=args.reasoning_summary_events,
        open_responses_events=args.open_responses_events,
        mcp_allow=_mcp_allow(args.mcp_allow),
        tool_servers=_tool_servers(args.tool_server),
        max_tool_calls=_at_least("--max-tool-calls", args.max_tool_calls, 1),
        tool_call_timeout=_at_least("--tool-call-timeout", args.tool_call_timeout, 0.001),
        reasoning_key=_reasoning_key(args.reasoning_key),
        ws_turns_memory=_at_least("--ws-turns-memory", args.ws_turns_memory, 1) << 20,
    )


def _reasoning_key(secret: str | None) -> str | None:
    if secret is not None and len(secret) < MIN_SECRET_CHARS:
        raise StartupError(f"--reasoning-key must have at least {MIN_SECRET_CHARS} characters")
    return secret


def _build_engine(name: str, args: argparse.Namespace, vocab: Vocab) -> Engine:
    if args.script is not None and name != "scripted":
        raise StartupError("--script is only used with --engine scripted")
    if args.upstream_url and name != "upstream":
        raise StartupError("--upstream-url is only used with --engine upstream")
    if name == "vllm" and args.guided_decoding_backend:
        raise StartupError("--guided-decoding-backend is the trtllm engine's: vLLM's grammar backend is its own "
                           "--structured-outputs-config.backend")
    if name not in ("trtllm", "vllm") and (args.trtllm_serve or args.guided_decoding_backend):
        unknown = " ".join(args.trtllm_serve) or "--guided-decoding-backend"
        raise StartupError(f"unrecognized arguments: {unknown} (not harmony-proxy's; a trtllm-serve command line "
                           "is only taken with --engine trtllm, a vllm serve one with --engine vllm)")
    delay = args.token_delay_ms / 1000
    if name == "scripted":
        if args.script is None:
            raise StartupError("--engine scripted needs --script FILE (JSON Lines of {\"completion\": ...})")
        return scripted_engine(vocab, read_script(args.script), delay, args.tokens_per_step)
    if name == "mock":
        return mock_engine(vocab, delay, args.tokens_per_step)
    if name == "upstream":
        from proxy.engines.upstream.engine import UpstreamEngine
        from proxy.engines.upstream.kv_subscriber import EventBudget

        if not args.upstream_url:
            raise StartupError("--engine upstream needs --upstream-url http://host:port/v1 (repeatable)")
        if not args.upstream_kv_events_budget > 0:
            raise StartupError("--upstream-kv-events-budget is in MiB per second, more than 0 (--upstream-kv-events "
                               "off routes without the events)")
        model = args.upstream_model or args.served_model_name or DEFAULT_MODEL
        limit = DEFAULT_CONCURRENCY if args.max_concurrent_requests is None else args.max_concurrent_requests
        return UpstreamEngine(vocab, args.upstream_url, model,
                              args.upstream_flavor, args.upstream_api_key, args.upstream_connect_timeout,
                              args.upstream_read_timeout, args.upstream_guided_decoding, args.upstream_routing,
                              kv_events=args.upstream_kv_events == "auto",
                              kv_events_budget=EventBudget(args.upstream_kv_events_budget * 2**20),
                              kv_events_bind=tuple(args.upstream_kv_events_bind),
                              max_in_flight=limit or None)  # as admission_queue: 0 is no limit
    if name == "vllm":
        from proxy.engines.vllm.engine import VllmEngine

        vllm = VllmEngine(vllm_command(args), vocab)
        vllm.prepare()  # vLLM's own parsing, now: its errors stop the server before anything is served
        return vllm
    from proxy.engines.trtllm.engine import TrtllmEngine

    engine = TrtllmEngine(trtllm_command(args), vocab, args.guided_decoding_backend, args.host)
    engine.prepare()  # trtllm-serve's own parsing, now: its errors stop the server before anything is served
    return engine


def trtllm_command(args: argparse.Namespace) -> list[str]:
    """The trtllm-serve command line harmony-proxy was given, with its log level."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise StartupError("--engine trtllm needs TensorRT-LLM: pip install 'harmony-proxy[trtllm]' on a CUDA "
                           "machine, or run inside NVIDIA's TensorRT-LLM container")
    return [*args.trtllm_serve, "--log_level", args.log_level]


def vllm_command(args: argparse.Namespace) -> list[str]:
    """The `vllm serve` command line harmony-proxy was given, with the options both read (the served name, which
    labels vLLM's metrics, and the context window, which sizes its engine)."""
    if importlib.util.find_spec("vllm") is None:
        raise StartupError("--engine vllm needs vLLM in this Python environment: pip install 'harmony-proxy[vllm]' "
                           "(docs/vllm.md)")
    shared = ["--served-model-name", args.served_model_name] if args.served_model_name else []
    if args.max_model_len:
        shared += ["--max-model-len", str(args.max_model_len)]
    return [*args.trtllm_serve, *shared]
