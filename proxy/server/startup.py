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

from parsers.vocab import Vocab, load_vocab
from proxy.admission import AdmissionQueue, AdmittedEngine
from proxy.browsers import allowed_hosts
from proxy.config import ServerConfig
from proxy.engines.base import Engine
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import read_script, scripted_engine
from proxy.engines.trtllm_args import (
    FLAG_ARGUMENTS,
    TrtllmFlags,
    engine_context,
    llm_arguments,
)
from proxy.responses.sealing import MIN_SECRET_CHARS
from proxy.server.arguments import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONTEXT,
    DEFAULT_MODEL,
    TRTLLM_IGNORED,
    TRTLLM_ONLY,
    TRTLLM_REFUSED,
    StartupError,
    default_store_path,
)
from proxy.server_tools.allow import McpAllowList, McpUrlRefused, parse_target
from proxy.state import ServerState
from proxy.store.base import OnOperation, ResponseStore
from proxy.store.sqlite import SQLiteResponseStore
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import TracedEngine, traced_store_operations, tracer_from_environment

logger = logging.getLogger("harmony_proxy")
TRTLLM_MAX_BATCH_SIZE = 2048  # trtllm-serve's default --max_batch_size


def choose_store_path(args: argparse.Namespace, engine_name: str, argv: list[str]) -> Path | None:
    """Where responses are stored when --store-path is not given: the user's data folder for a real model; for
    the mock and scripted engines, which people try and test with, a temporary folder (returned, for removal
    when the server stops; workers are told the path through `argv`)."""
    if args.store_path is not None or args.store_url or args.no_store or engine_name not in ("mock", "scripted"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="harmony-proxy-store-"))
    # uvicorn hands SIGTERM on once it has shut down: end by SystemExit then, so the folder is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args.store_path = folder / "responses.sqlite3"
    argv += ["--store-path", str(args.store_path)]
    logger.info("storing responses in %s until the server stops (--store-path to keep them)", args.store_path)
    return folder


def build_state(args: argparse.Namespace, engine_name: str, engine: Engine | None = None) -> ServerState:
    """Everything a server process needs; `engine` replaces the one the options name (a worker's remote engine)."""
    vocab = load_vocab()
    llm_args = trtllm_arguments(args) if engine_name == "trtllm" else None  # once: it says what it decided
    config = server_config(args, engine_name, llm_args)
    if engine is None:
        engine = _build_engine(engine_name, args, vocab, config, llm_args)
    metrics = Metrics(config.served_model_name, engine.name, config.max_model_len)
    try:
        tracer = tracer_from_environment()
    except (ValueError, ImportError) as exc:
        raise StartupError(f"tracing: {exc}") from None
    on_store_operation = metrics.store_operation
    if tracer is not None:
        engine = TracedEngine(engine)  # inside admission: the engine span starts once the request is admitted
        on_store_operation = traced_store_operations(on_store_operation)
    engine = AdmittedEngine(engine, admission_queue(args, engine_name, metrics, llm_args))
    return ServerState(config, vocab, engine, open_store(args, on_store_operation), metrics, tracer)


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
    args: argparse.Namespace, engine_name: str, metrics: Metrics | None = None, llm_args: dict[str, Any] | None = None
) -> AdmissionQueue:
    """The admission limits of one server process (with no limit, the queue still counts running requests)."""
    on_change = metrics.admission_changed if metrics is not None else None
    limit = args.max_concurrent_requests
    if limit is None:
        if engine_name == "trtllm":
            # One engine serves every worker: its batch is shared among them.
            batch = (llm_args or trtllm_arguments(args)).get("max_batch_size") or TRTLLM_MAX_BATCH_SIZE
            limit = -(-batch // args.workers)
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


def trtllm_flag_notices(args: argparse.Namespace) -> None:
    """A notice for each trtllm-serve flag given that means nothing here; an error for one refused."""
    for flag, reason in TRTLLM_REFUSED.items():
        if getattr(args, flag) is not None:
            raise StartupError(f"--{flag} is not supported: {reason}")
    for flag, reason in TRTLLM_IGNORED.items():
        if getattr(args, flag) is not None:
            logger.info("--%s %s accepted and ignored: %s", flag, getattr(args, flag), reason)


def engine_choice(args: argparse.Namespace) -> str:
    model = args.model or args.model_argument
    if args.engine:
        name = args.engine
    elif args.upstream_url:
        name = "upstream"
    elif importlib.util.find_spec("tensorrt_llm") is not None:
        name = "trtllm"
    else:
        if model:
            raise StartupError(f"model {model} needs TensorRT-LLM, which is not installed here: install "
                               "harmony-proxy[trtllm] on a CUDA machine, or pass --engine mock")
        logger.info("no --engine given and TensorRT-LLM is not installed: serving the built-in MOCK engine "
                    "(no model weights; answers are placeholders)")
        return "mock"
    logger.info("serving with the %s engine%s", name, f" ({model})" if model and name == "trtllm" else "")
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


def server_config(args: argparse.Namespace, engine_name: str, llm_args: dict[str, Any] | None = None) -> ServerConfig:
    model = args.model or args.model_argument
    served = args.served_model_name or (model if engine_name == "trtllm" and model else DEFAULT_MODEL)
    return ServerConfig(
        served_model_name=served,
        reasoning_field=args.reasoning_field,
        default_reasoning_effort=args.default_reasoning_effort,
        max_model_len=_context(args, engine_name, llm_args),
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


def _context(args: argparse.Namespace, engine_name: str, llm_args: dict[str, Any] | None) -> int:
    """The context the server advertises: --max-model-len, else what the engine will take (said at start-up)."""
    if engine_name != "trtllm":
        return args.max_model_len or args.max_seq_len or DEFAULT_CONTEXT
    context, longest_prompt = engine_context(llm_args if llm_args is not None else trtllm_arguments(args))
    chunked = ("chunked prefill on" if longest_prompt == context else
               "chunked prefill off: --enable_chunked_prefill takes prompts up to the context")
    logger.info("context %d tokens, prompt plus output (max_seq_len); prompts up to %d tokens (%s)", context,
                longest_prompt, chunked)
    if args.max_model_len and args.max_model_len > context:
        logger.warning("--max-model-len %d is more than the engine's max_seq_len %d: longer requests get a 400 from "
                       "TensorRT-LLM", args.max_model_len, context)
    return args.max_model_len or context


def _build_engine(
    name: str, args: argparse.Namespace, vocab: Vocab, config: ServerConfig, llm_args: dict[str, Any] | None = None
) -> Engine:
    if args.script is not None and name != "scripted":
        raise StartupError("--script is only used with --engine scripted")
    if args.upstream_url and name != "upstream":
        raise StartupError("--upstream-url is only used with --engine upstream")
    trtllm_flags = [flag for flag in TRTLLM_ONLY if getattr(args, flag) not in (None, False, [])]
    if trtllm_flags and name != "trtllm":
        raise StartupError(f"--{trtllm_flags[0]} is only used with --engine trtllm")
    delay = args.token_delay_ms / 1000
    if name == "scripted":
        if args.script is None:
            raise StartupError("--engine scripted needs --script FILE (JSON Lines of {\"completion\": ...})")
        return scripted_engine(vocab, read_script(args.script), delay, args.tokens_per_step)
    if name == "mock":
        return mock_engine(vocab, delay, args.tokens_per_step)
    if name == "upstream":
        from proxy.engines.upstream import UpstreamEngine

        if not args.upstream_url:
            raise StartupError("--engine upstream needs --upstream-url http://host:port/v1 (repeatable)")
        return UpstreamEngine(vocab, args.upstream_url, args.upstream_model or config.served_model_name,
                              args.upstream_flavor, args.upstream_api_key, args.upstream_connect_timeout,
                              args.upstream_read_timeout, args.upstream_guided_decoding, args.upstream_routing)
    from proxy.engines.trtllm import TrtllmEngine

    return TrtllmEngine(llm_args if llm_args is not None else trtllm_arguments(args), vocab)


def trtllm_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """`tensorrt_llm.LLM` keyword arguments from trtllm-serve's flags and YAML, checked against the installed
    TensorRT-LLM."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise StartupError("--engine trtllm needs TensorRT-LLM: pip install 'harmony-proxy[trtllm]' on a CUDA "
                           "machine, or run inside NVIDIA's TensorRT-LLM container")
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    flags = TrtllmFlags(
        model=args.model or args.model_argument or DEFAULT_MODEL,
        backend=args.backend,
        extra_llm_api_options=args.extra_llm_api_options,
        guided_decoding_backend=args.guided_decoding_backend,
        kv_cache_free_gpu_memory_fraction=args.kv_cache_free_gpu_memory_fraction,
        flags={dest: getattr(args, dest) for dest in FLAG_ARGUMENTS},
        settings=list(args.settings),
    )
    return llm_arguments(flags, set(TorchLlmArgs.model_fields.keys()) | {"backend"})
