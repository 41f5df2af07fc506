"""The command line of `harmony-proxy serve`: harmony-proxy's own options, and a trtllm-serve (or vllm serve) command.

`harmony-proxy serve MODEL [any trtllm-serve options] [harmony-proxy options]`: the options below are
harmony-proxy's; every other argument is trtllm-serve's, handed as it is to the installed trtllm-serve's own
`serve` command (`proxy/engines/trtllm/serve.py`), whose parsing, defaults, YAML and errors then apply. No list
of trtllm-serve's flags is kept here. The two share `--host`, `--port` and `--log_level` (harmony-proxy's, also
given to trtllm-serve's logger) and `--num_serve_frontends` (harmony-proxy's `--workers`: front-end processes
sharing one engine). With `--engine vllm` the other arguments are a `vllm serve` command line, handed the same way
to the installed vLLM's own parser (`proxy/engines/vllm/serve.py`); `--served-model-name` and `--max-model-len` are
then both harmony-proxy's and vLLM's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from pathlib import Path

from proxy.config import EFFORTS, REASONING_FIELDS, ServerConfig
from proxy.engines.trtllm.engine import GUIDED_DECODING_BACKENDS
from proxy.engines.upstream.constraints import DEFAULT_GUIDED_DECODING, GUIDED_DECODING
from proxy.engines.upstream.engine import FLAVORS
from proxy.engines.upstream.routing import ROUTERS
from proxy.responses.sealing import KEY_ENV
from proxy.server.connections import ConnectionLimits
from proxy.telemetry.access_log import LOG_FORMATS

ENGINES = ("mock", "scripted", "trtllm", "upstream", "vllm")
DEFAULT_MODEL = "openai/gpt-oss-20b"
DEFAULT_CONTEXT = 131072
DEFAULT_CONCURRENCY = 1024  # streams one process serves with fair first-token times (benchmarks/load_bench.py)

def _version() -> str:
    try:
        return importlib.metadata.version("harmony-proxy")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that was not installed
        return "unknown"


def default_store_path() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "harmony-proxy" / "responses.sqlite3"


class StartupError(Exception):
    """A problem with the options or files, reported in one line before anything is served."""


class HelpFormatter(argparse.HelpFormatter):
    """Each option's spellings with its metavar once, and its default where it has one (secrets never shown)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        metavar = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {metavar}"

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, [], argparse.SUPPRESS) and action.dest not in SECRET_OPTIONS
        if shown and "%(default)" not in text and "default" not in text:
            text += (" " if text else "") + "(default %(default)s)"
        return text


# Options whose default comes from the environment and is a secret: --help must not print it.
SECRET_OPTIONS = frozenset({"api_key", "upstream_api_key", "reasoning_key", "store_url"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harmony-proxy", description="OpenAI-compatible server for gpt-oss.",
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI APIs over HTTP", allow_abbrev=False,
                                usage="%(prog)s [MODEL [trtllm-serve options]] [options]",
                                formatter_class=HelpFormatter)
    serve.set_defaults(trtllm_serve=[])  # parse_command_line: every argument that is not harmony-proxy's
    serve.add_argument("--engine", choices=ENGINES,
                       help="default: trtllm when TensorRT-LLM is installed, else mock (upstream with --upstream-url); "
                            "vllm: vLLM in this process, the other arguments a `vllm serve` command line")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--served-model-name",
                       help=f"the model name clients send (default: the engine command's model, else {DEFAULT_MODEL})")
    serve.add_argument("--reasoning-field", choices=REASONING_FIELDS, default=ServerConfig.reasoning_field,
                       help="Chat Completions: the field reasoning is sent in (both: the same text in each)")
    serve.add_argument("--default-reasoning-effort", choices=EFFORTS, default=ServerConfig.default_reasoning_effort,
                       help="reasoning effort when a request gives none")
    serve.add_argument("--max-model-len", type=int,
                       help=f"context window, prompt plus output (default: the engine's, else {DEFAULT_CONTEXT}; with "
                            "--engine vllm also given to vLLM)")
    serve.add_argument("--api-key", default=os.environ.get("HARMONY_PROXY_API_KEY"),
                       help="require `Authorization: Bearer KEY` on every route but /live, /health, /ready and the "
                            "playground page (/metrics too, unless --metrics-public; or set HARMONY_PROXY_API_KEY)")
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
    serve.add_argument("--log-level", "--log_level", default="info", choices=("debug", "info", "warning", "error"),
                       help="the lowest level logged")
    serve.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="text, or json: every log line one JSON object (default text)")
    serve.add_argument("--log-requests", action="store_true",
                       help="also log each request's body and headers (prompts included; never "
                            "Authorization, Proxy-Authorization, Cookie, X-Api-Key or Api-Key)")
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

    trtllm = serve.add_argument_group("trtllm engine (every other argument is trtllm-serve's)")
    trtllm.add_argument("--guided-decoding-backend", "--guided_decoding_backend", dest="guided_decoding_backend",
                        choices=GUIDED_DECODING_BACKENDS,
                        help="replace the LLM argument guided_decoding_backend that trtllm-serve computed (none: "
                             "remove it); default: as trtllm-serve, the YAML's, else unset (constraints are then "
                             "only described in the prompt, not enforced)")

    upstream = serve.add_argument_group("upstream engine")
    upstream.add_argument("--upstream-url", action="append", default=[],
                          help="an OpenAI-compatible base URL, e.g. http://host:8000/v1 (repeat for replicas of one "
                               "model: see --upstream-routing)")
    upstream.add_argument("--upstream-flavor", choices=sorted(FLAVORS), default="vllm",
                          help="how the upstream returns token ids: vllm (also harmony-proxy), sglang, trtllm, dynamo")
    upstream.add_argument(
        "--upstream-guided-decoding", choices=GUIDED_DECODING,
        help="how the upstream enforces tool_choice and response_format, as it was started: xgrammar or llguidance "
             "(its grammar backend, applied from the first generated token: the whole completion is sent), "
             "final-json (only the final answer's JSON Schema: vLLM 0.32 applies it from the first generated token, "
             "so the answer is the bare JSON with no reasoning), none; default: "
             + ", ".join(f"{mode} for {flavor}" for flavor, mode in DEFAULT_GUIDED_DECODING.items()))
    upstream.add_argument("--upstream-model", help="the model name the upstream serves (default: --served-model-name)")
    upstream.add_argument("--upstream-api-key", default=os.environ.get("HARMONY_PROXY_UPSTREAM_API_KEY"),
                          help="sent as a bearer token (or set HARMONY_PROXY_UPSTREAM_API_KEY)")
    upstream.add_argument(
        "--upstream-routing", choices=ROUTERS, default="cache-aware",
        help="which of several --upstream-url replicas serves a request: cache-aware (where the prompt's longest "
             "prefix went, bounded by load; session keys as hints) or round-robin")
    upstream.add_argument(
        "--upstream-kv-events", choices=("auto", "off"), default="auto",
        help="cache-aware routing on the KV-cache events replicas publish (vLLM's --kv-events-config, found through "
             "their /kv_event_sources): auto uses them where published, off routes on what was sent only")
    upstream.add_argument(
        "--upstream-kv-events-budget", type=float, default=2.0, metavar="MIB_PER_S",
        help="MiB per second of KV-cache events each replica may send; past it, its events are dropped and what it "
             "holds forgotten until it is within it")
    upstream.add_argument(
        "--upstream-kv-events-bind", action="append", default=[], metavar="ADDRESS",
        help="a ZMQ address (tcp://10.0.0.5:5557) harmony-proxy may listen on for a replica whose publisher connects "
             "there (repeat); without it, harmony-proxy only connects to publishers")
    upstream.add_argument("--upstream-connect-timeout", type=float, default=5.0, help="seconds")
    upstream.add_argument("--upstream-read-timeout", type=float, default=600.0, help="seconds between chunks")
    return parser


def parse_command_line(argv: list[str] | None) -> argparse.Namespace:
    """harmony-proxy's options; the remaining arguments, in their order, as `trtllm_serve` (trtllm-serve's, or with
    --engine vllm vllm serve's)."""
    args, rest = build_parser().parse_known_args(argv)
    args.trtllm_serve = rest
    if rest and args.command != "serve":
        build_parser().error(f"unrecognized arguments: {' '.join(rest)}")
    return args
