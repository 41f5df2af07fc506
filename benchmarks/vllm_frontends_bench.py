"""harmony-proxy and vLLM's own OpenAI front end, side by side, on one vLLM process.

    python benchmarks/vllm_frontends_bench.py [--streams 1,16,64] [--tokens 64] [--chaos-prompts 40]

One real vLLM (the tests' tiny gpt-oss, tests/vllm_server.py) serves both columns: vLLM's own `/v1/chat/completions`
(its Harmony rendering, reasoning and tool parsers: `--enable-auto-tool-choice --tool-call-parser openai`) and
harmony-proxy (`--engine upstream`, a process of its own) in front of the same server's `/v1/completions`.

Latency and cost: at each concurrency, the same streamed Chat Completions (`--tokens` each) go through each front end;
the client times the first token (TTFT) and the gaps between chunks, and the front end's CPU per generated token is
read from /proc: vLLM's API server process for its own front end; harmony-proxy's process plus that API server (it
still serves harmony-proxy's `/v1/completions`) for harmony-proxy. vLLM's engine-core process is the engine, shared,
and not counted.

Robustness: a second vLLM runs a "chaos" checkpoint (tests/vllm_server.py's `biased_weights`) whose output head
favours Harmony's special tokens and channel words, so the output looks like a confused gpt-oss (missing
`<|message|>`, repeated headers, calls to unknown tools, cut-off JSON). The same prompts and seeds go through both
front ends, streamed and not: counted are 5xx answers, answers leaking special tokens or Harmony markup, and
streamed answers that differ from the non-streamed answer to the same request.
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
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsers.vocab import load_vocab
from tests.vllm_server import VllmServer, biased_weights, free_port, write_tiny_gpt_oss

VLLM_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "openai", "--max-num-seqs", "64"]
MARKUP = re.compile(r"<\|[a-z_]+\|>|\bto=functions\.|<\|channel\|>|\bassistantcommentary|\bassistantanalysis")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}]


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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class HarmonyProxy:
    """harmony-proxy as a process of its own, in front of a vLLM server."""

    def __init__(self, upstream: VllmServer, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--engine", "upstream", "--upstream-url", upstream.base_url,
             "--served-model-name", upstream.model, "--port", str(self.port), "--no-store", "--log-level",
             "warning", "--max-concurrent-requests", "256"],
            cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"harmony-proxy did not start; see {log}")

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(20)


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, list[float], int]:
    """TTFT, the gaps between chunks that carried text, and the completion tokens of one streamed request."""
    started = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    async with client.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True,
                                                                       "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens") or 0
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if any(delta.get(field) for field in ("content", "reasoning", "reasoning_content", "tool_calls")):
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    return (first or time.perf_counter()) - started, gaps, tokens


async def latency(url: str, model: str, streams: int, tokens: int, pids: list[int]) -> dict[str, float]:
    """Streams with no seed: vLLM 0.32's CPU sampler fails a batch of many seeded requests ("CPU Generator does not
    use offset"), which ends its engine."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
            "max_tokens": tokens, "temperature": 1.0}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=streams + 4)) as client:
        await one_stream(client, url, {**body, "max_tokens": 4})  # warm
        cpu_before = [cpu_seconds(pid) for pid in pids]
        results = await asyncio.gather(*(one_stream(client, url, body) for _ in range(streams)))
        cpu = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
    ttfts = sorted(r[0] for r in results)
    gaps = sorted(g for r in results for g in r[1])
    generated = sum(r[2] for r in results)
    return {"TTFT p50 ms": 1000 * statistics.median(ttfts),
            "gap p50 ms": 1000 * statistics.median(gaps) if gaps else 0.0,
            "gap p99 ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else 0.0,
            "front-end CPU us/token": 1e6 * sum(cpu) / max(1, generated),
            "  of which vLLM's API server": 1e6 * cpu[0] / max(1, generated)}


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
            for field in ("content", "reasoning", "reasoning_content"):
                message[field] += delta.get(field) or ""
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


def table(title: str, columns: dict[str, dict[str, float]]) -> None:
    names = list(columns)
    print(title)
    print(f"{'':28}" + "".join(f"{name:>26}" for name in names) + f"{'ratio':>10}")
    for key in columns[names[0]]:
        values = [columns[name][key] for name in names]
        ratio = f"{values[1] / values[0]:10.2f}" if len(values) == 2 and values[0] else ""
        print(f"{key:28}" + "".join(f"{value:26.2f}" if isinstance(value, float) else f"{value:>26}"
                                    for value in values) + ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,16,64", help="concurrent streams, comma-separated")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each latency stream generates")
    parser.add_argument("--chaos-prompts", type=int, default=40)
    parser.add_argument("--chaos-tokens", type=int, default=96)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="vllm-frontends-"))
    cache = Path(tempfile.gettempdir()) / "harmony-proxy-tok"
    plain = write_tiny_gpt_oss(folder / "model", tokenizer_cache=cache)
    chaos = write_tiny_gpt_oss(folder / "chaos", biased_weights(chaos_bias()), tokenizer_cache=cache)
    for model_dir, label in ((plain, "latency"), (chaos, "chaos")):
        server = VllmServer(model_dir, VLLM_FLAGS, log_path=folder / f"vllm-{label}.log").start().wait_ready()
        proxy = None
        try:
            proxy = HarmonyProxy(server, folder / f"proxy-{label}.log")
            assert server.process is not None
            api_server = [server.process.pid]
            fronts = {"vLLM's own front end": (server.url, api_server),
                      "harmony-proxy": (proxy.url, [*api_server, proxy.process.pid])}
            if label == "latency":
                for streams in (int(n) for n in args.streams.split(",")):
                    columns = {name: asyncio.run(latency(url, server.model, streams, args.tokens, pids))
                               for name, (url, pids) in fronts.items()}
                    table(f"\n{streams} concurrent stream(s), {args.tokens} tokens each (same vLLM process)", columns)
            else:
                columns = {name: asyncio.run(robustness(url, server.model, args.chaos_prompts, args.chaos_tokens))
                           for name, (url, _) in fronts.items()}
                table(f"\nchaos checkpoint: {args.chaos_prompts} prompts x (plain, streamed), same seeds", columns)
        finally:
            if proxy is not None:
                proxy.stop()
            server.stop()
    print(f"\nlogs in {folder}")


if __name__ == "__main__":
    main()
