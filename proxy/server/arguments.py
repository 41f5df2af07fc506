"""The command line of `harmony-proxy serve`: every option, and the trtllm-serve flags it takes.

Every trtllm-serve command of NVIDIA's gpt-oss guides can be typed with `harmony-proxy serve` in its place:
the model as the first argument, and `--tp_size`, `--ep_size`, `--extra_llm_api_options`, ... with underscores
or dashes. Every flag of trtllm-serve serve, gpt-oss-dev to 2026 main, is taken: mapped to the same LLM argument,
accepted with a one-line notice where it has no meaning here, or refused with the reason.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from proxy.config import EFFORTS, REASONING_FIELDS, ServerConfig
from proxy.engines.routing import ROUTERS
from proxy.engines.trtllm_args import (
    FLAG_ARGUMENTS,
    GUIDED_DECODING_BACKENDS,
)
from proxy.engines.upstream import FLAVORS
from proxy.engines.upstream_constraints import DEFAULT_GUIDED_DECODING, GUIDED_DECODING
from proxy.responses.sealing import KEY_ENV
from proxy.server.connections import ConnectionLimits
from proxy.telemetry.access_log import LOG_FORMATS

ENGINES = ("mock", "scripted", "trtllm", "upstream")
DEFAULT_MODEL = "openai/gpt-oss-20b"
DEFAULT_CONTEXT = 131072
DEFAULT_CONCURRENCY = 1024  # streams one process serves with fair first-token times (benchmarks/load_bench.py)
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
    serve.add_argument("--ws-turns-memory", type=int, default=1024, metavar="MiB",
                       help="WebSocket: memory the turns remembered by all connections of a process may hold "
                            "together (each connection at most 16 MiB); the least recently used go first; "
                            "default %(default)s")
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
