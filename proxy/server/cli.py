"""`harmony-proxy serve` (also `python -m proxy serve`): parse options, load the vocabulary, serve.

Every trtllm-serve command of NVIDIA's gpt-oss guides can be typed with `harmony-proxy serve` in its place:
the model as the first argument, and `--tp_size`, `--ep_size`, `--extra_llm_api_options`, ... with underscores
or dashes. Every flag of trtllm-serve serve, gpt-oss-dev to 2026 main, is taken: mapped to the same LLM argument,
accepted with a one-line notice where it has no meaning here, or refused with the reason.
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
import signal
import socket
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from parsers.vocab import Vocab, VocabError, load_vocab
from proxy.admission import AdmissionQueue, AdmittedEngine
from proxy.app import create_app
from proxy.browsers import allowed_hosts
from proxy.config import EFFORTS, REASONING_FIELDS, ServerConfig
from proxy.engines.base import Engine
from proxy.engines.mock import mock_engine
from proxy.engines.routing import ROUTERS
from proxy.engines.scripted import ScriptError, read_script, scripted_engine
from proxy.engines.trtllm_args import (
    FLAG_ARGUMENTS,
    GUIDED_DECODING_BACKENDS,
    LlmArgsError,
    TrtllmFlags,
    engine_context,
    llm_arguments,
)
from proxy.engines.upstream import FLAVORS
from proxy.engines.upstream_constraints import DEFAULT_GUIDED_DECODING, GUIDED_DECODING
from proxy.responses.sealing import KEY_ENV, MIN_SECRET_CHARS
from proxy.responses.store import OnOperation, ResponseStore
from proxy.responses.store_sqlite import SQLiteResponseStore
from proxy.server.connections import ConnectionGuard, ConnectionLimits, default_max_connections, raise_descriptor_limit
from proxy.server.workers import ARGV_ENV, ENGINE_SOCKET_ENV, serve_workers
from proxy.server_tools.allow import McpAllowList, McpUrlRefused, parse_target
from proxy.state import ServerState
from proxy.telemetry.access_log import LOG_FORMATS, configure_logging
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import TracedEngine, traced_store_operations, tracer_from_environment
from proxy.validation import MAX_BODY_BYTES

logger = logging.getLogger("harmony_proxy")
ENGINES = ("mock", "scripted", "trtllm", "upstream")
DEFAULT_MODEL = "openai/gpt-oss-20b"
DEFAULT_CONTEXT = 131072
DEFAULT_CONCURRENCY = 1024  # streams one process serves with fair first-token times (benchmarks/load_bench.py)
TRTLLM_MAX_BATCH_SIZE = 2048  # trtllm-serve's default --max_batch_size
# trtllm-serve flags that mean nothing here: accepted, each with a one-line notice.
TRTLLM_IGNORED = {
    "num_postprocess_workers": "harmony-proxy detokenizes nothing (the engine returns token ids and the Harmony "
                               "parser reads them in the server); --workers sets the HTTP processes",
    "reasoning_parser": "gpt-oss's reasoning is parsed by harmony-proxy's own Harmony parser",
    "tool_parser": "gpt-oss's tool calls are parsed by harmony-proxy's own Harmony parser",
    "chat_template": "prompts are rendered by openai-harmony, as trtllm-serve renders gpt-oss's",
    "media_io_kwargs": "gpt-oss takes text only",
}
# trtllm-serve flags of what harmony-proxy does not do: refused, with the reason.
TRTLLM_REFUSED = {
    "metadata_server_config_file": "disaggregated serving is not run in process: put harmony-proxy --engine upstream "
                                   "in front of trtllm-serve's disaggregated deployment",
    "server_role": "disaggregated serving is not run in process: put harmony-proxy --engine upstream in front of "
                   "trtllm-serve's disaggregated deployment",
    "disagg_cluster_uri": "disaggregated serving is not run in process: put harmony-proxy --engine upstream in front "
                          "of trtllm-serve's disaggregated deployment",
    "custom_module_dirs": "harmony-proxy serves gpt-oss, whose model TensorRT-LLM has built in; custom model "
                          "modules are not loaded",
}
TRTLLM_ONLY = ("model", "model_argument", *(flag for flag in FLAG_ARGUMENTS if flag != "max_seq_len"),
               "kv_cache_free_gpu_memory_fraction",
               "extra_llm_api_options", "guided_decoding_backend", "settings", *TRTLLM_IGNORED)


def default_store_path() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "harmony-proxy" / "responses.sqlite3"


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


class StartupError(Exception):
    """A problem with the options or files, reported in one line before anything is served."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harmony-proxy", description="OpenAI-compatible server for gpt-oss.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI APIs over HTTP")
    serve.add_argument("model_argument", nargs="?", metavar="MODEL", help="model for --engine trtllm (as trtllm-serve)")
    serve.add_argument("--engine", choices=ENGINES,
                       help="default: trtllm when TensorRT-LLM is installed, else mock (upstream with --upstream-url)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name",
                       help=f"the model name clients send (default: the model, or {DEFAULT_MODEL})")
    serve.add_argument("--reasoning-field", choices=REASONING_FIELDS, default=ServerConfig.reasoning_field)
    serve.add_argument("--default-reasoning-effort", choices=EFFORTS, default=ServerConfig.default_reasoning_effort)
    serve.add_argument("--max-model-len", type=int,
                       help=f"context window, prompt plus output (default: --max_seq_len, else {DEFAULT_CONTEXT})")
    serve.add_argument("--api-key", default=os.environ.get("HARMONY_PROXY_API_KEY"),
                       help="require `Authorization: Bearer KEY` on every route but /health, /ready and the playground "
                            "page (/metrics too, unless --metrics-public; or set HARMONY_PROXY_API_KEY)")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="on SIGTERM, seconds running requests may take to finish before they are aborted")
    serve.add_argument("--drain-seconds", type=float, default=0.0, metavar="SECONDS",
                       help="on SIGTERM, answer 503 on /ready at once and keep serving this long (for a load "
                            "balancer to stop sending), then shut down; default %(default)s")
    serve.add_argument("--ws-ping-interval", type=float, default=20.0, metavar="SECONDS",
                       help="WebSocket (/v1/responses): ping the client this often, keeping idle connections open")
    serve.add_argument("--ws-ping-timeout", type=float, default=20.0, metavar="SECONDS",
                       help="WebSocket: close a connection whose client has not answered a ping within this")
    serve.add_argument("--log-level", "--log_level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="text, or json: every log line one JSON object (default text)")
    serve.add_argument("--log-requests", action="store_true",
                       help="also log each request's body and headers (prompts included; never Authorization)")
    serve.add_argument("--metrics-public", action="store_true", help="serve /metrics without the --api-key")
    serve.add_argument("--allowed-hosts", action="append", default=[], metavar="NAME[,NAME...]",
                       help="host names clients may reach the server by (the Host header; repeatable; * for any); "
                            "the loopback names and --host always; default: those alone when --host is a loopback "
                            "address, else any")
    serve.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGIN[,ORIGIN...]",
                       help="browser origins (https://app.example.com) that may call the API, with CORS "
                            "(repeatable; * for any); requests from other sites' pages are refused (403); default: "
                            "none but the server's own pages")

    capacity = serve.add_argument_group("capacity")
    capacity.add_argument("--workers", "--num_serve_frontends", "--num-serve-frontends", dest="workers", type=int,
                          default=1, help="HTTP front-end processes sharing the port (vLLM's --api-server-count, "
                                          "trtllm-serve's --num_serve_frontends); default 1")
    capacity.add_argument("--max-concurrent-requests", type=int, metavar="N",
                          help="requests generating at once (default: --max_batch_size, else 2048, for trtllm; "
                               f"{DEFAULT_CONCURRENCY} per worker for the other engines; 0: no limit)")
    capacity.add_argument("--max-tools", type=int, default=ServerConfig.max_tools,
                          help="tools one request may declare (default %(default)s, as OpenAI)")
    capacity.add_argument("--max-tools-schema-bytes", type=int, default=ServerConfig.max_tools_schema_bytes,
                          help="JSON size of all of a request's tools (default %(default)s)")
    capacity.add_argument("--max-queue", type=int, metavar="M",
                          help="requests waiting for a slot, first come first served, before 429s (default: as "
                               "many as --max-concurrent-requests)")

    connections = serve.add_argument_group("connections (slow and idle clients)")
    connections.add_argument("--request-head-timeout", type=float, default=ConnectionLimits.head_timeout,
                             metavar="S", help="seconds a connection has to send a complete request head, from "
                             "connecting or from the end of the keep-alive time after a response; else it is "
                             "closed (default %(default)s)")
    connections.add_argument("--request-body-timeout", type=float, default=ConnectionLimits.body_timeout,
                             metavar="S", help="seconds a request's body may take to arrive after its head; else "
                             "the connection is closed (default %(default)s). Responses, streams included, are not "
                             "timed")
    connections.add_argument("--keep-alive-timeout", type=float, default=ConnectionLimits.keep_alive_timeout,
                             metavar="S", help="seconds an idle keep-alive connection stays open after a response "
                             "(uvicorn's timeout_keep_alive; default %(default)s)")
    connections.add_argument("--max-connections", type=int, metavar="N",
                             help="open connections per process; past it a new connection closes the one that has "
                             "waited longest without a request, and is refused (503) only when every one is serving "
                             "a request (default: 7/8 of the open-file limit, which is raised to 65536 where the "
                             "hard limit allows; 0: no cap)")

    responses = serve.add_argument_group("Responses API")
    responses.add_argument("--store-path", type=Path,
                           help=f"SQLite file of stored responses (default: {default_store_path()}; with the mock "
                                "and scripted engines a file in a temporary folder, removed when the server stops)")
    responses.add_argument("--store-url", default=os.environ.get("HARMONY_PROXY_STORE_URL"), metavar="URL",
                           help="a PostgreSQL database (postgresql://user:password@host:port/name) that stores "
                                "responses and conversations instead of the SQLite file, shared by replicas "
                                "(default: $HARMONY_PROXY_STORE_URL)")
    responses.add_argument("--no-store", action="store_true", help="store no responses")
    responses.add_argument("--reasoning-key", default=os.environ.get(KEY_ENV), metavar="SECRET",
                           help="secret (16+ characters) that encrypted_content is sealed under (reasoning, "
                                f"compaction); give replicas the same one; or set {KEY_ENV} (default: a random "
                                "key per start)")
    responses.add_argument("--reasoning-summary-events", action="store_true",
                           help="also stream reasoning as response.reasoning_summary_text.* events")
    responses.add_argument("--mcp-allow", action="append", default=[], metavar="URL-PREFIX",
                           help="an MCP server URL prefix clients may name in {\"type\": \"mcp\"} tools (repeatable; "
                                "scheme, host and port must match, the path at a '/'; redirects and SSE message "
                                "endpoints too); none: every server_url is refused")
    responses.add_argument("--tool-server", action="append", default=[], metavar="URL",
                           help="an MCP server providing gpt-oss's browser and/or python tool, for web_search_preview "
                                "and code_interpreter (repeatable; a URL ending in /sse is reached over SSE)")
    responses.add_argument("--max-tool-calls", type=int, default=ServerConfig.max_tool_calls, metavar="N",
                           help="server-side tool calls (MCP, browser, python) one response may run; a request's "
                                "max_tool_calls may lower it (default %(default)s)")
    responses.add_argument("--tool-call-timeout", type=float, default=ServerConfig.tool_call_timeout, metavar="S",
                           help="seconds one server-side tool call may take before it is cancelled and reported to "
                                "the model as failed (default %(default)s)")
    responses.add_argument("--open-responses-events", action="store_true",
                           help="name raw reasoning events response.reasoning.* (Open Responses spec) rather than "
                                "response.reasoning_text.* (OpenAI SDK)")

    playback = serve.add_argument_group("scripted and mock engines")
    playback.add_argument("--script", type=Path, help="JSON Lines completions for --engine scripted")
    playback.add_argument("--token-delay-ms", type=float, default=0.0,
                          help="the engine's pace: a step every N ms for every request (default 0: when asked)")
    playback.add_argument("--tokens-per-step", type=int, default=1,
                          help="tokens per engine step (TensorRT-LLM's stream_interval); default 1")

    trtllm = serve.add_argument_group("trtllm engine (flags as trtllm-serve; dashes or underscores)")
    trtllm.add_argument("--model", help="Hugging Face id or local path (or give it as the first argument)")
    trtllm.add_argument("--backend", default="pytorch", choices=("pytorch",))
    for names, kind, help_text in (
        (("tokenizer",), str, None),
        (("custom_tokenizer",), str, None),
        (("tp_size", "tensor_parallel_size"), int, "tensor parallel size"),
        (("pp_size", "pipeline_parallel_size"), int, "pipeline parallel size"),
        (("cp_size", "context_parallel_size"), int, "context parallel size"),
        (("ep_size", "moe_expert_parallel_size"), int, "MoE expert parallel size"),
        (("cluster_size", "moe_cluster_parallel_size"), int, "MoE cluster parallel size"),
        (("gpus_per_node",), int, None),
        (("max_beam_width",), int, None),
        (("max_batch_size",), int, None),
        (("max_num_tokens",), int, ("tokens one engine step takes (trtllm-serve's default 8192): without "
                                    "--enable_chunked_prefill, also the longest prompt")),
        (("max_seq_len",), int, "prompt plus output (default: the model's, 131072 for gpt-oss)"),
        (("kv_cache_free_gpu_memory_fraction", "free_gpu_memory_fraction"), float, None),
        (("revision", "hf_revision"), str, None),
        (("otlp_traces_endpoint",), str, None),
        (("num_postprocess_workers",), int, "accepted, no meaning here (a notice says why)"),
        (("reasoning_parser",), str, "accepted, no meaning here: the Harmony parser is ours"),
        (("tool_parser",), str, "accepted, no meaning here: the Harmony parser is ours"),
        (("chat_template",), str, "accepted, no meaning here: openai-harmony renders prompts"),
        (("media_io_kwargs",), str, "accepted, no meaning here: gpt-oss takes text only"),
        (("metadata_server_config_file",), str, "refused: disaggregated serving"),
        (("server_role",), str, "refused: disaggregated serving"),
        (("disagg_cluster_uri",), str, "refused: disaggregated serving"),
        (("custom_module_dirs",), str, "refused: custom model modules"),
    ):
        trtllm.add_argument(*_spellings(*names), dest=names[0], type=kind, help=help_text)
    for name, help_text in (
        ("trust_remote_code", None),
        ("enable_chunked_prefill", ("take prompts longer than --max_num_tokens, in chunks (off by default, as "
                                    "trtllm-serve)")),
        ("enable_attention_dp", None),
        ("fail_fast_on_attention_window_too_large", None),
    ):
        trtllm.add_argument(*_spellings(name), dest=name, action="store_true", help=help_text)
    trtllm.add_argument("--extra_llm_api_options", "--extra-llm-api-options", "--config", dest="extra_llm_api_options",
                        type=Path, help="YAML of further tensorrt_llm.LLM arguments; it overrides the flags, as "
                                        "trtllm-serve's does")
    trtllm.add_argument("--set", dest="settings", action="append", default=[], metavar="PATH=VALUE",
                        help="one LLM argument, after the YAML (repeatable), e.g. kv_cache_config.enable_block_reuse="
                             "false")
    trtllm.add_argument("--guided-decoding-backend", "--guided_decoding_backend", dest="guided_decoding_backend",
                        choices=GUIDED_DECODING_BACKENDS,
                        help="the grammar backend that enforces tool_choice and response_format (LLM argument "
                             "guided_decoding_backend); default auto: the YAML's, else llguidance; none: only "
                             "described in the prompt")

    upstream = serve.add_argument_group("upstream engine")
    upstream.add_argument("--upstream-url", action="append", default=[],
                          help="an OpenAI-compatible base URL, e.g. http://host:8000/v1 (repeat for round robin)")
    upstream.add_argument("--upstream-flavor", choices=sorted(FLAVORS), default="vllm",
                          help="how the upstream returns token ids: vllm (also harmony-proxy), sglang, trtllm, dynamo")
    upstream.add_argument(
        "--upstream-guided-decoding", choices=GUIDED_DECODING,
        help="how the upstream enforces tool_choice and response_format, as it was started: xgrammar or llguidance "
             "(its grammar backend, applied from the first generated token: the whole completion is sent), "
             "final-json (only the final answer's JSON Schema: a stock vLLM serving gpt-oss applies the grammar "
             "after the reasoning), none; default: "
             + ", ".join(f"{mode} for {flavor}" for flavor, mode in DEFAULT_GUIDED_DECODING.items()))
    upstream.add_argument("--upstream-model", help="the model name the upstream serves (default: --served-model-name)")
    upstream.add_argument("--upstream-api-key", default=os.environ.get("HARMONY_PROXY_UPSTREAM_API_KEY"),
                          help="sent as a bearer token (or set HARMONY_PROXY_UPSTREAM_API_KEY)")
    upstream.add_argument(
        "--upstream-routing", choices=ROUTERS, default="cache-aware",
        help="which of several --upstream-url replicas serves a request: cache-aware (where the prompt's longest "
             "prefix went, bounded by load; session keys as hints) or round-robin")
    upstream.add_argument("--upstream-connect-timeout", type=float, default=5.0, help="seconds")
    upstream.add_argument("--upstream-read-timeout", type=float, default=600.0, help="seconds between chunks")
    return parser


def _spellings(*names: str) -> list[str]:
    """trtllm-serve's underscore spelling of each name, and the dashed one."""
    return [spelling for name in names for spelling in (f"--{name}", f"--{name.replace('_', '-')}")]


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    raise_descriptor_limit()  # --workers processes inherit it
    loop, http = runtime()
    logger.info("event loop %s, HTTP parser %s, %d worker process%s", loop, http, args.workers,
                "" if args.workers == 1 else "es")
    arguments = list(sys.argv[1:] if argv is None else argv)
    temporary = None
    try:
        _check_capacity(args)
        engine_name = engine_choice(args)
        temporary = choose_store_path(args, engine_name, arguments)
        _trtllm_flag_notices(args)
        if args.workers > 1:
            serve_workers(args, arguments, engine_name, uvicorn_options(args), run_trtllm_host)
            return
        listening = bind(args)  # before the engine starts: a port in use stops the server before anything loads
        state = build_state(args, engine_name)
        run_server(args, state, listening)
    except (StartupError, VocabError, ScriptError, LlmArgsError) as exc:
        print(f"harmony-proxy: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def bind(args: argparse.Namespace) -> socket.socket:
    """The listening socket, as uvicorn binds it (it logs the error and exits when the address is in use)."""
    return uvicorn.Config(None, **uvicorn_options(args)).bind_socket()


def run_server(args: argparse.Namespace, state: ServerState, listening: socket.socket) -> None:
    failures: list[BaseException] = []

    def engine_failed(error: BaseException) -> None:
        failures.append(error)
        server.should_exit = True  # an engine that cannot start must not leave a server that answers 503 forever

    app = create_app(state, on_engine_failure=engine_failed)
    freeze_startup_objects()
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(args)))
    server.run(sockets=[listening])
    if failures:
        print(f"harmony-proxy: error: the {state.engine.name} engine failed to start: {failures[0]}", file=sys.stderr)
        raise SystemExit(1)


def worker_app() -> Starlette:
    """The application of one `--workers` process (uvicorn calls this factory in each, `proxy/server/workers.py`)."""
    args = build_parser().parse_args(json.loads(os.environ[ARGV_ENV]))
    configure_logging(args.log_level, args.log_format)
    engine_name = engine_choice(args)
    engine = None
    if engine_name == "trtllm":
        from proxy.engines.remote import RemoteEngine

        engine = RemoteEngine(os.environ[ENGINE_SOCKET_ENV], name="trtllm")
    app = create_app(build_state(args, engine_name, engine))
    freeze_startup_objects()
    return app


def run_trtllm_host(argv: list[str], socket_path: str) -> None:
    """The `--workers` engine host process's main function: the LLM is built in this process's main thread."""
    from proxy.engines.host import run_engine_host
    from proxy.engines.trtllm import loaded_trtllm_engine

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    arguments = trtllm_arguments(args)
    run_engine_host(functools.partial(loaded_trtllm_engine, arguments), socket_path, args.log_level)


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
    if http == "httptools":
        http = ConnectionGuard(limits).protocol  # closes slow and idle connections (proxy/server/connections.py)
    return {"host": args.host, "port": args.port, "loop": loop, "http": http, "log_config": None,
            "log_level": args.log_level, "timeout_graceful_shutdown": args.shutdown_timeout,
            "timeout_keep_alive": limits.keep_alive_timeout,
            "access_log": False,  # ours (proxy/telemetry/access_log.py) has the request id, tokens and timings
            # WebSocket (proxy/responses/websocket.py): the websockets library, its pings, and a message as
            # large as an HTTP body may be (a larger one closes the connection with 1009).
            "ws": "websockets-sansio", "ws_ping_interval": args.ws_ping_interval,
            "ws_ping_timeout": args.ws_ping_timeout, "ws_max_size": MAX_BODY_BYTES}


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    cap = args.max_connections
    if cap is None:
        cap = default_max_connections(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    return ConnectionLimits(args.request_head_timeout, args.request_body_timeout, args.keep_alive_timeout, cap)


def build_state(args: argparse.Namespace, engine_name: str, engine: Engine | None = None) -> ServerState:
    """Everything a server process needs; `engine` replaces the one the options name (a worker's remote engine)."""
    vocab = load_vocab()
    llm_args = trtllm_arguments(args) if engine_name == "trtllm" else None  # once: it says what it decided
    config = _config(args, engine_name, llm_args)
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
        from proxy.responses.store_postgres import PostgresResponseStore  # psycopg, loaded only when used

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


def _check_capacity(args: argparse.Namespace) -> None:
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


def _trtllm_flag_notices(args: argparse.Namespace) -> None:
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


def _config(args: argparse.Namespace, engine_name: str, llm_args: dict[str, Any] | None = None) -> ServerConfig:
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
