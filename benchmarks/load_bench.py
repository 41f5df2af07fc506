"""Load benchmark: streaming Chat Completions over real HTTP + SSE, ours side by side with the bare floor.

    .venv/bin/python benchmarks/load_bench.py                       # ours (this tree) and bare; a few minutes
    .venv/bin/python benchmarks/load_bench.py --git-ref 37e9190     # ... and a previous commit of ours
    .venv/bin/python benchmarks/load_bench.py --concurrency 64,1024 --tokens-per-step 1 --duration 5
    .venv/bin/python benchmarks/load_bench.py --servers ours,bare --ours-args="--workers 2"
    .venv/bin/python benchmarks/load_bench.py --step-ms 1                  # an engine with a pace of its own
    .venv/bin/python benchmarks/load_bench.py --server-cmd 'other={python} -m other --port {port}'
    .venv/bin/python benchmarks/load_bench.py --traced --git-ref main --tokens-per-step 1   # tracing off and on
    .venv/bin/python benchmarks/load_bench.py --upstream --servers ours,upstream --concurrency 64,1024

Servers, each a subprocess pinned to `--server-cpu` (default CPU 0; the client runs on `--client-cpu`, 1; each
takes a list such as 0-7 or 0,2: a server's workers share its CPUs, and the client runs one process per CPU,
the streams split between them, so that `--ours-args="--workers 8"` is not limited by one client core):
- ours: `python -m proxy serve --engine scripted` from this working tree, playing a generated script of one
  completion, a 90-token analysis then a 320-token final (420 tokens with the Harmony tokens around them);
- bare: benchmarks/bare_server.py, bare Starlette + sse-starlette sending 400 chunks of the same shape with
  no tokenizer or parser: the floor for a Python server built the usual way;
- ref (`--git-ref REF`): ours as of commit REF, extracted with `git archive` (git state is not touched) to
  /tmp, or a folder that holds such a tree (for a machine without this repository's .git), run with this venv
  and PYTHONPATH on it, with `--ours-args` too; at every tokens-per-step if its CLI has the flag, else at 1;
- traced (`--traced`): ours with OpenTelemetry tracing on (OTEL_EXPORTER_OTLP_ENDPOINT), exporting its spans
  over OTLP/HTTP to a sink in this process that counts the bytes; with `--git-ref` of a commit before tracing
  existed, ours against ref is the cost of tracing off, traced against ours the cost of tracing on;
- upstream (`--upstream`): ours with `--engine upstream`, in front of a harmony-proxy playing the same script
  (`--engine scripted`, no admission limit, `--upstream-args` added) on `--upstream-cpu`: the cost of reading an
  upstream next to the engine in process, as ours (the front end's CPU alone is counted); its table ends the run;
  with `--upstream-canned` the upstream is benchmarks/canned_upstream.py instead (the same completion, pre-built:
  a fast upstream where few cores are left for it; `--upstream-args` go to it, e.g. "--batch 1 --step-ms 20");
- `--server-cmd NAME=TEMPLATE` (repeatable): any command; {python}, {port}, {script}, {tokens_per_step},
  {step_ms} are filled in, and {upstream}, the base URL of the `--upstream` server; run at every tokens-per-step
  if it uses {tokens_per_step}, else at 1 only.

The engine's pace (`--step-ms`): 0 (the default) is an engine with no pace of its own: it makes a step each time
the server asks for one, after one turn of the event loop, so every step is a frame and the figures are the cost
of a frame. A pace P > 0 is an engine that, like a GPU, makes a step every P ms whatever the server does (ours'
`--token-delay-ms`; bare sleeps P ms between chunks, as a server written the usual way would pace them): a
server that falls behind it finds several steps waiting, and ours sends them as one frame (tok/frame shows how
many tokens a frame carried on average). Use whole milliseconds: uvloop's timers and clock have a resolution of
one, so at 0.5 ms the steps come two at a time.

For each tokens-per-step K (default 1 and 10) the servers are started together and, for each concurrency C (default
64, 256, 1024), measured one after the other (the first to go turns with each C): one request alone (it checks the
answer and gives the tokens per frame), then C clients (benchmarks/sse_client.py: asyncio on uvloop, one keep-alive
connection per client, requests back to back, closed loop) stream for `--warmup` then `--duration` seconds, and all
connections are dropped. Server CPU is utime + stime of the server's process tree (all workers) from /proc at the
window's start and end, divided by the tokens delivered in the window (frames received times tokens per
frame from the usage chunks). Between runs the benchmark waits for the server to go idle.

Columns: tok/s; us/tok, server CPU per token, and /bare, its ratio to bare's at the same K and C; TTFT p50/p99
over every first token from the warm-up's start to the window's end (at 1,024 streams a stream outlasts the
run, so this is the first wave: it shows whether admission is fair) and maxwait, the longest wait for a first
token, requests still waiting at the end included; gap50/gap99 between frames of one stream in the window
(frames that arrive in one read count 0); done, streams finished in the window; 429, rejected (the client
waits `--retry-pause` and sends again); errors, other statuses and lost connections; client, this process's
CPU share (near 100% would mean the client, not the server, was the limit).
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import math
import multiprocessing
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: `parsers` comes from this tree

from sse_client import LoadResult, LoadStats, ProbeFailed, build_request, run_load

from parsers.vocab import Vocab, load_vocab

MODEL = "openai/gpt-oss-20b"
ANALYSIS_TOKENS, FINAL_TOKENS, BARE_TOKENS = 90, 320, 400
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
PROSE = (
    " The user asks about the weather in Paris this weekend, so I should give a short forecast.",
    " Saturday looks mild with a light breeze from the west and a few clouds in the afternoon.",
    " Sunday brings a chance of showers in the morning, clearing by the evening with cooler air.",
    " Temperatures stay between twelve and nineteen degrees, which is normal for the season.",
    " If you plan to walk along the river, take a light jacket and an umbrella just in case.",
)


def text_of(vocab: Vocab, tokens: int) -> str:
    """Prose that encodes to exactly `tokens` tokens."""
    text, index = "", 0
    while len(vocab.encode(text + PROSE[index % len(PROSE)])) <= tokens:
        text += PROSE[index % len(PROSE)]
        index += 1
    while len(vocab.encode(text)) < tokens:
        text += " ok"  # one token each
    assert len(vocab.encode(text)) == tokens
    return text


def write_script(path: Path) -> int:
    """The scripted engine's completion; returns its length in tokens."""
    vocab = load_vocab()
    completion = (f"<|channel|>analysis<|message|>{text_of(vocab, ANALYSIS_TOKENS)}<|end|>"
                  f"<|start|>assistant<|channel|>final<|message|>{text_of(vocab, FINAL_TOKENS)}<|return|>")
    path.write_text(json.dumps({"completion": completion}) + "\n", encoding="utf-8")
    return len(vocab.encode_harmony(completion))


@dataclass
class ServerKind:
    name: str
    template: list[str]  # {python} {port} {script} {tokens_per_step} {step_ms} filled in
    cwd: Path
    env: dict[str, str]
    every_k: bool  # can stream several tokens per step

    def command(self, port: int, script: Path, tokens_per_step: int, step_ms: float, upstream: str = "") -> list[str]:
        values = {"python": sys.executable, "port": port, "script": script, "tokens_per_step": tokens_per_step,
                  "step_ms": step_ms, "upstream": upstream}
        return [part.format(**values) for part in self.template]


CANNED = ["{python}", "benchmarks/canned_upstream.py", "--port", "{port}", "--script", "{script}"]
OURS = ["{python}", "-m", "proxy", "serve", "--engine", "scripted", "--script", "{script}", "--port", "{port}",
        "--log-level", "warning", "--no-store", "--token-delay-ms", "{step_ms}"]


def server_kinds(args: argparse.Namespace) -> dict[str, ServerKind]:
    env = dict(os.environ)
    kinds = {
        "ours": ServerKind("ours", [*OURS, "--tokens-per-step", "{tokens_per_step}", *shlex.split(args.ours_args)],
                           ROOT, env, True),
        "bare": ServerKind("bare", ["{python}", str(ROOT / "benchmarks" / "bare_server.py"), "--port", "{port}",
                                    "--tokens", str(BARE_TOKENS), "--tokens-per-step", "{tokens_per_step}",
                                    "--step-ms", "{step_ms}"],
                           ROOT, env, True),
    }
    if args.git_ref:
        tree = Path(args.git_ref) if Path(args.git_ref).is_dir() else extract_commit(args.git_ref)
        every_k = any("--tokens-per-step" in path.read_text(encoding="utf-8")
                  for path in (tree / "proxy").rglob("*.py"))  # the CLI moved between commits
        template = [*OURS, *(["--tokens-per-step", "{tokens_per_step}"] if every_k else []),
                    *shlex.split(args.ours_args)]
        path = os.pathsep.join(filter(None, [str(tree.resolve()), env.get("PYTHONPATH")]))  # packages may come by it
        kinds["ref"] = ServerKind(f"ref {Path(args.git_ref).name}", template, tree.resolve(),
                                  {**env, "PYTHONPATH": path}, every_k)
    if args.upstream:
        kinds["upstream"] = ServerKind("upstream", [
            "{python}", "-m", "proxy", "serve", "--engine", "upstream", "--upstream-url", "{upstream}", "--port",
            "{port}", "--log-level", "warning", "--no-store", *shlex.split(args.ours_args)], ROOT, env, True)
    if args.traced:
        traced_env = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{args.traced.port}",
                      "OTEL_SERVICE_NAME": "harmony-proxy-bench"}
        kinds["traced"] = ServerKind("traced", kinds["ours"].template, ROOT, traced_env, True)
    for spec in args.server_cmd:
        name, _, template = spec.partition("=")
        kinds[name] = ServerKind(name, shlex.split(template), ROOT, env, "{tokens_per_step}" in template)
    return kinds


def extract_commit(ref: str) -> Path:
    """The tree of commit `ref` under /tmp (reused when already there), by `git archive`, not a checkout."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"harmony-proxy-{sha[:12]}"
    if not (tree / ".complete").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {ref} failed")
        (tree / ".complete").touch()
    return tree


class Server:
    """A server subprocess on one CPU, its log in a file, its CPU time read from /proc."""

    def __init__(self, kind: ServerKind, tokens_per_step: int, step_ms: float, script: Path, cpus: set[int],
                 logs: Path, upstream: str = "") -> None:
        self.kind, self.port = kind, free_port()
        self.log = logs / f"{kind.name.replace(' ', '-')}-k{tokens_per_step}.log"
        command = kind.command(self.port, script, tokens_per_step, step_ms, upstream)
        with self.log.open("wb") as log:
            # Its own process group, so that stop() reaches workers and wrapped commands too.
            self.process = subprocess.Popen(command, cwd=kind.cwd, env=kind.env, stdout=log, stderr=subprocess.STDOUT,
                                            preexec_fn=lambda: os.sched_setaffinity(0, cpus),  # noqa: PLW1509 (a C call)
                                            start_new_session=True)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"{self.kind.name} did not become healthy; its log ({self.log}):\n"
                         + self.log.read_text(errors="replace")[-3000:])

    def cpu_seconds(self) -> float:
        """utime + stime of the server and every live descendant (several workers, if it runs them)."""
        stats = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    stat = Path(entry.path, "stat").read_bytes()
                except OSError:
                    continue
                fields = stat[stat.rfind(b")") + 2:].split()
                stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
        tree, found = {self.process.pid}, True
        while found:
            found = False
            for pid, (parent, _) in stats.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    found = True
        return sum(stats[pid][1] for pid in tree if pid in stats) / CLOCK_TICK

    def settle(self, timeout: float = 15.0) -> None:
        """Wait until the server is idle again (streams of the last run aborted and cleaned up)."""
        deadline, before = time.monotonic() + timeout, self.cpu_seconds()
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = self.cpu_seconds()
            if now - before <= 1.5 / CLOCK_TICK:
                return
            before = now

    def stop(self) -> None:
        for signal_number, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, signal_number)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            deadline = time.monotonic() + wait  # the leader is gone; give the rest of the group the same time
            while time.monotonic() < deadline and group_alive(self.process.pid):
                time.sleep(0.1)
            if not group_alive(self.process.pid):
                break


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Row:
    server: str
    tokens_per_step: int
    concurrency: int
    result: LoadResult

    @property
    def cpu_per_token_us(self) -> float:
        tokens = self.result.stats.tokens()
        return self.result.server_cpu / tokens * 1e6 if tokens else float("nan")


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


HEADER = (f"{'server':<14} {'K':>3} {'C':>5} {'tok/s':>8} {'us/tok':>7} {'/bare':>6} {'tok/frame':>9} {'TTFT50':>8} "
          f"{'TTFT99':>8} "
          f"{'maxwait':>8} {'gap50':>7} {'gap99':>7} {'done':>6} {'429':>6} {'errors':>7} {'client':>6}")


def seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.1f}ms" if value < 1 else f"{value:.2f}s"


def format_row(row: Row, bare: Row | None) -> str:
    stats, result = row.result.stats, row.result
    cost = row.cpu_per_token_us
    ratio = f"{cost / bare.cpu_per_token_us:.2f}" if bare and row is not bare and bare.cpu_per_token_us else "-"
    return (f"{row.server:<14} {row.tokens_per_step:>3} {row.concurrency:>5} {stats.tokens() / result.window:>8.0f} "
            f"{cost:>7.1f} {ratio:>6} {stats.tokens_per_frame():>9.2f} {seconds(percentile(stats.ttft, 0.5)):>8} "
            f"{seconds(percentile(stats.ttft, 0.99)):>8} {seconds(result.max_wait):>8} "
            f"{seconds(percentile(stats.gaps, 0.5)):>7} {seconds(percentile(stats.gaps, 0.99)):>7} "
            f"{stats.completed:>6} {stats.rejected:>6} {sum(stats.errors.values()):>7} {result.client_cpu:>6.0%}")


def measure(server: Server, tokens_per_step: int, concurrency: int, args: argparse.Namespace) -> Row:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = build_request("127.0.0.1", server.port, "/v1/chat/completions", body)
    cpus = sorted(args.client_cpu)
    shares = [concurrency // len(cpus) + (index < concurrency % len(cpus)) for index in range(len(cpus))]
    try:
        if len(cpus) == 1:
            result = load(server, request, concurrency, args)
        else:
            result = merge(in_processes(server, request, list(zip(cpus, shares)), args))
    except ProbeFailed as exc:
        raise SystemExit(f"{server.kind.name}: {exc}; its log ({server.log}):\n"
                         + server.log.read_text(errors="replace")[-3000:]) from None
    server.settle()
    return Row(server.kind.name, tokens_per_step, concurrency, result)


def load(server: Server, request: bytes, concurrency: int, args: argparse.Namespace) -> LoadResult:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_load("127.0.0.1", server.port, request, concurrency, args.warmup, args.duration,
                                   server.cpu_seconds, args.retry_pause))


def in_processes(server: Server, request: bytes, shares: list[tuple[int, int]],
                 args: argparse.Namespace) -> list[LoadResult]:
    """One client process per CPU (forked, so nothing is pickled on the way in), each with its share of streams."""
    context = multiprocessing.get_context("fork")
    pipes = []
    for cpu, concurrency in shares:
        reader, writer = context.Pipe(duplex=False)

        def child(cpu: int = cpu, concurrency: int = concurrency, writer: Connection = writer) -> None:
            os.sched_setaffinity(0, {cpu})
            try:
                writer.send(load(server, request, concurrency, args))
            except ProbeFailed as exc:
                writer.send(exc)

        process = context.Process(target=child, daemon=True)
        process.start()
        writer.close()
        pipes.append((process, reader))
    results = []
    for process, reader in pipes:
        try:
            results.append(reader.recv())
        except EOFError:
            results.append(ProbeFailed("a client process died"))
        process.join()
    for result in results:
        if isinstance(result, ProbeFailed):
            raise result
    return results


def merge(results: list[LoadResult]) -> LoadResult:
    """The client processes' runs as one: their windows open within milliseconds of each other, so counts add up
    over the mean window, and server CPU is the mean of what each window saw, per second; client is the busiest."""
    stats = LoadStats(phase="over")
    for result in results:
        part = result.stats
        stats.frames += part.frames
        stats.completed += part.completed
        stats.rejected += part.rejected
        stats.errors.update(part.errors)
        stats.ttft += part.ttft
        stats.gaps += part.gaps
        stats.usage_tokens += part.usage_tokens
        stats.usage_frames += part.usage_frames
    window = sum(result.window for result in results) / len(results)
    server_cpu = sum(result.server_cpu / result.window for result in results) / len(results) * window
    return LoadResult(stats, window, max(result.client_cpu for result in results),
                      max(result.max_wait for result in results), server_cpu)


class OtlpSink:
    """An OTLP/HTTP endpoint on loopback, in a thread of this process: it takes each export and answers 200."""

    def __init__(self) -> None:
        sink = self
        self.exports = self.bytes = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bytes += len(self.rfile.read(int(self.headers.get("content-length", 0))))
                sink.exports += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def cpu_list(text: str) -> set[int]:
    """0, 0-7 or 0,2,4-5."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--servers", help="comma-separated: ours, bare, ref, names of --server-cmd "
                                           "(default: all of those configured)")
    options.add_argument("--concurrency", type=integers, default=[64, 256, 1024], help="default 64,256,1024")
    options.add_argument("--tokens-per-step", type=integers, default=[1, 10], help="default 1,10")
    options.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    options.add_argument("--warmup", type=float, default=2.0, help="seconds before the window opens (default 2)")
    options.add_argument("--step-ms", type=float, default=0.0,
                         help="the engine's pace, ms per step (default 0: a step whenever the server asks)")
    options.add_argument("--retry-pause", type=float, default=0.1, help="seconds a client waits after a 429")
    options.add_argument("--git-ref", help="also measure this commit of ours (as server 'ref')")
    options.add_argument("--server-cmd", action="append", default=[], metavar="NAME=TEMPLATE",
                         help="also measure this command (see the module docstring)")
    options.add_argument("--ours-args", default="",
                         help='extra `proxy serve` options for ours, e.g. --ours-args="--workers 2"')
    options.add_argument("--traced", action="store_true", help="also measure ours with tracing on ('traced')")
    options.add_argument("--upstream", action="store_true",
                         help="also measure ours in front of an upstream harmony-proxy ('upstream')")
    options.add_argument("--upstream-canned", action="store_true",
                         help="the upstream is benchmarks/canned_upstream.py (pre-built chunks, next to no CPU per "
                              "token), not a harmony-proxy: a fast upstream on a machine of few cores")
    options.add_argument("--upstream-cpu", type=cpu_list, help="the upstream's CPUs (default: the server's)")
    options.add_argument("--upstream-args", default="",
                         help='extra `proxy serve` options for the upstream, e.g. --upstream-args="--workers 4"')
    options.add_argument("--server-cpu", type=cpu_list, default={0}, help="CPUs, e.g. 0 or 0-7 (default 0)")
    options.add_argument("--client-cpu", type=cpu_list, default={1},
                         help="CPUs, one client process each, e.g. 1 or 8-15 (default 1)")
    args = options.parse_args()
    args.traced = OtlpSink() if args.traced else None

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if max(args.concurrency) + 100 > hard:
        print(f"warning: the fd limit is {hard}; {max(args.concurrency)} connections may not all open", file=sys.stderr)
    os.sched_setaffinity(0, args.client_cpu)

    kinds = server_kinds(args)
    names = args.servers.split(",") if args.servers else list(kinds)
    unknown = [name for name in names if name not in kinds]
    if unknown:
        raise SystemExit(f"unknown server {unknown[0]!r}: configured are {', '.join(kinds)}")

    logs = Path(tempfile.mkdtemp(prefix="harmony-proxy-load-"))
    script = logs / "script.jsonl"
    completion_tokens = write_script(script)
    print(f"server on CPUs {sorted(args.server_cpu)}, client on CPUs {sorted(args.client_cpu)} "
          f"(one process each); {args.warmup:g} s warm-up, "
          f"{args.duration:g} s measured per run; engine pace {args.step_ms:g} ms per step; "
          f"ours streams {completion_tokens} tokens per request "
          f"({ANALYSIS_TOKENS} analysis + {FINAL_TOKENS} final text), bare {BARE_TOKENS}; "
          f"logs in {logs}\nK = tokens per engine step, C = concurrent streams; us/tok = server CPU per token\n",
          flush=True)
    print(HEADER, flush=True)
    rows: list[Row] = []
    for tokens_per_step in args.tokens_per_step:
        servers: list[Server] = []
        behind: Server | None = None
        try:
            upstream = ""
            if args.upstream:
                behind_command = (CANNED if args.upstream_canned else
                                  [*OURS, "--tokens-per-step", "{tokens_per_step}", "--max-concurrent-requests", "0"])
                behind = Server(ServerKind("behind", [*behind_command, *shlex.split(args.upstream_args)], ROOT,
                                           dict(os.environ), True),
                                tokens_per_step, args.step_ms, script, args.upstream_cpu or args.server_cpu, logs)
                behind.wait_healthy()
                upstream = f"http://127.0.0.1:{behind.port}/v1"
            for name in names:
                if kinds[name].every_k or tokens_per_step == 1:
                    servers.append(Server(kinds[name], tokens_per_step, args.step_ms, script, args.server_cpu, logs,
                                          upstream))
            for server in servers:
                server.wait_healthy()
                server.settle()  # idle: with --workers, /health answers before every worker is up
            for index, concurrency in enumerate(args.concurrency):
                # Each level starts with the next server, so that none is always measured first (or last).
                turn = index % len(servers)
                measured = {server.kind.name: measure(server, tokens_per_step, concurrency, args)
                            for server in servers[turn:] + servers[:turn]}
                level = [measured[server.kind.name] for server in servers]
                bare = measured.get("bare")
                for row in level:
                    print(format_row(row, bare), flush=True)
                    if row.result.stats.errors:
                        print(f"    errors: {dict(row.result.stats.errors)}", flush=True)
                rows += level
        finally:
            for server in [*servers, *([behind] if behind else [])]:
                server.stop()
    print("\n/bare = server CPU per token over bare's at the same K and C (lower is better).")
    print_comparison(rows)
    print_comparison(rows, "traced", "ours")
    print_upstream(rows)
    if args.traced:
        print(f"\nthe OTLP sink received {args.traced.exports} exports, {args.traced.bytes / 1e6:.1f} MB of spans")


def print_comparison(rows: list[Row], server: str = "ours", baseline: str = "ref ") -> None:
    """Ours against the previous commit (--git-ref), or another pair of servers, per K and C, where both ran."""
    refs = {(row.tokens_per_step, row.concurrency): row for row in rows if row.server.startswith(baseline)}
    pairs = [(row, refs[row.tokens_per_step, row.concurrency]) for row in rows
             if row.server == server and (row.tokens_per_step, row.concurrency) in refs]
    if pairs:
        print(f"\n{server} against {pairs[0][1].server}:")
    for ours, ref in pairs:
        rates = [row.result.stats.tokens() / row.result.window for row in (ours, ref)]
        print(f"  {server} K={ours.tokens_per_step:<3} C={ours.concurrency:<5} "
              f"server CPU per token {ours.cpu_per_token_us:.1f} "
              f"us vs {ref.cpu_per_token_us:.1f} us ({ours.cpu_per_token_us / ref.cpu_per_token_us:.2f}x); "
              f"tokens/s {rates[0]:.0f} vs {rates[1]:.0f}")

def print_upstream(rows: list[Row]) -> None:
    """Upstream mode against the engine in process, per K and C: the front end's CPU per token, TTFT, errors."""
    ours = {(row.tokens_per_step, row.concurrency): row for row in rows if row.server == "ours"}
    pairs = [(row, ours[row.tokens_per_step, row.concurrency]) for row in rows
             if row.server == "upstream" and (row.tokens_per_step, row.concurrency) in ours]
    if not pairs:
        return
    print("\nupstream (ours in front of an upstream harmony-proxy) against ours (the engine in process):")
    print(f"{'K':>3} {'C':>5} {'us/tok up':>9} {'in-proc':>8} {'ratio':>6} {'TTFT50 up':>10} {'in-proc':>8} "
          f"{'TTFT99 up':>10} {'in-proc':>8} {'ratio99':>7} {'errors up':>9} {'in-proc':>7} {'429 up':>6} "
          f"{'in-proc':>7}")
    for up, local in pairs:
        ttft = [(percentile(row.result.stats.ttft, 0.5), percentile(row.result.stats.ttft, 0.99))
                for row in (up, local)]
        errors = [sum(row.result.stats.errors.values()) for row in (up, local)]
        print(f"{up.tokens_per_step:>3} {up.concurrency:>5} {up.cpu_per_token_us:>9.1f} {local.cpu_per_token_us:>8.1f} "
              f"{up.cpu_per_token_us / local.cpu_per_token_us:>6.2f} {seconds(ttft[0][0]):>10} "
              f"{seconds(ttft[1][0]):>8} {seconds(ttft[0][1]):>10} {seconds(ttft[1][1]):>8} "
              f"{ttft[0][1] / ttft[1][1]:>7.2f} {errors[0]:>9} {errors[1]:>7} {up.result.stats.rejected:>6} "
              f"{local.result.stats.rejected:>7}")


if __name__ == "__main__":
    main()
