"""How the upstream engine gets token ids from a vLLM, three ways, on one vLLM process: what each costs.

    python benchmarks/upstream_ids_bench.py [--prompt-tokens 200,8000] [--streams 16] [--tokens 64] [--rounds 3]

One real vLLM (the tests' tiny gpt-oss with dummy weights, tests/vllm_server.py) started with `--enable-scale-out`,
so it serves both endpoints. harmony-proxy's `UpstreamEngine` drives it in this process, one way at a time:

- `return_token_ids` on `/v1/completions`: the ids in `choices[].token_ids`, and vLLM echoes the prompt's ids in
  the first chunk (what the upstream engine sent before; the baseline);
- `logprobs: 0` + `return_tokens_as_token_ids` on `/v1/completions`: the ids as `token_id:N` strings in `logprobs`
  (what it sends a vLLM without the token-only endpoint);
- `/inference/v1/generate`, vLLM's token-only endpoint (what it sends a vLLM that has it).

Each way: `--streams` concurrent requests of `--tokens` generated tokens (ignore_eos), the same prompt of each size
(vLLM's prefix cache holds it after the first round: the figures are the transport's and decoding's, not
prefill's). Printed per prompt size: bytes received from vLLM per request (counted by a TCP relay,
tests/byte_relay.py, in a pass of its own), and CPU per generated token of vLLM's API server, vLLM's engine core
(/proc) and this process (the upstream engine's reading), as the median of `--rounds` (each round takes the
three ways in turn, so the machine's load weighs on all alike), with the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsers.vocab import load_vocab
from proxy.engines.base import GenerationRequest, SamplingParams
from proxy.engines.upstream.engine import UpstreamEngine
from tests.byte_relay import ByteRelay
from tests.vllm_server import VllmServer, write_tiny_gpt_oss

WAYS = ("return_token_ids", "logprobs", "generate")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def engine_for(way: str, vocab, base_url: str, model: str) -> UpstreamEngine:
    engine = UpstreamEngine(vocab, [base_url], model, "vllm", token_endpoint=way == "generate")
    if way == "return_token_ids":  # what the vllm flavor sent before: the ids, and the prompt's echoed
        engine._fields = {"return_token_ids": True, "skip_special_tokens": False, "include_stop_str_in_output": True}
    return engine


async def run_requests(engine: UpstreamEngine, prompt: list[int], streams: int, tokens: int) -> int:
    """`streams` concurrent requests; the tokens generated."""

    async def one(n: int) -> int:
        request = GenerationRequest(f"bench-{time.monotonic_ns()}-{n}", prompt,
                                    SamplingParams(max_tokens=tokens, ignore_eos=True))
        got = 0
        async for step in engine.generate(request):
            got += len(step.token_ids)
        return got

    return sum(await asyncio.gather(*(one(n) for n in range(streams))))


def core_seconds(server: VllmServer) -> float:
    """CPU time of the API server's child processes: vLLM's engine core (and its helpers)."""
    return sum(cpu_seconds(pid) for pid in children(server.process.pid))


async def bytes_received(way: str, vocab, server: VllmServer, prompt: list[int], args) -> float:
    """Bytes from vLLM per request, counted by a relay in front of it (a pass of its own: the relay costs CPU)."""
    relay = ByteRelay(server.port).start()
    engine = engine_for(way, vocab, relay.url + "/v1", server.model)
    await engine.start()
    try:
        await run_requests(engine, prompt, 1, args.tokens)  # finds the endpoint; fills the prefix cache
        before = relay.received
        await run_requests(engine, prompt, args.streams, args.tokens)
        return (relay.received - before) / args.streams
    finally:
        await engine.close()
        relay.stop()


async def measure(vocab, server: VllmServer, prompt: list[int], args) -> dict[str, dict[str, float]]:
    """Each way's figures; the CPU rounds take the ways in turn, so a change in the machine's load hits all alike."""
    received = {way: await bytes_received(way, vocab, server, prompt, args) for way in WAYS}
    engines = {way: engine_for(way, vocab, server.base_url, server.model) for way in WAYS}
    rounds: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    try:
        for engine in engines.values():
            await engine.start()
            await run_requests(engine, prompt, 1, args.tokens)
        for _ in range(args.rounds):
            for way, engine in engines.items():
                api, core, ours = cpu_seconds(server.process.pid), core_seconds(server), time.process_time()
                generated = await run_requests(engine, prompt, args.streams, args.tokens)
                rounds[way].append({"api": (cpu_seconds(server.process.pid) - api) / generated * 1e6,
                                    "core": (core_seconds(server) - core) / generated * 1e6,
                                    "ours": (time.process_time() - ours) / generated * 1e6})
    finally:
        for engine in engines.values():
            await engine.close()
    return {way: {"bytes": received[way], **{name: statistics.median(r[name] for r in rounds[way])
                                             for name in ("api", "core", "ours")}} for way in WAYS}


def table(size: int, results: dict[str, dict[str, float]]) -> None:
    base = results["return_token_ids"]
    print(f"\nprompt of {size:,} tokens")
    print(f"| {'ids from':<18} | bytes / request | API server µs/token | engine core µs/token | "
          "upstream engine µs/token | API server + ours |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for way, r in results.items():
        both, base_both = r["api"] + r["ours"], base["api"] + base["ours"]
        print(f"| {way:<18} | {r['bytes']:>10,.0f} ({r['bytes'] / base['bytes']:.2f}) | {r['api']:>6.0f} "
              f"({r['api'] / base['api']:.2f}) | {r['core']:>6.0f} ({r['core'] / base['core']:.2f}) | "
              f"{r['ours']:>5.0f} ({r['ours'] / base['ours']:.2f}) | {both:>6.0f} ({both / base_both:.2f}) |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", default="200,8000")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("harmony_proxy.engine").setLevel(logging.ERROR)  # the start-up notices, once per engine
    vocab = load_vocab()
    sizes = [int(size) for size in args.prompt_tokens.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        model = write_tiny_gpt_oss(Path(folder) / "model")
        longest = max(sizes) + args.tokens + 64
        server = VllmServer(model, ["--enable-scale-out", "--enable-prompt-tokens-details",
                                    "--max-model-len", str(max(4096, longest)), "--max-num-seqs", "64"],
                            log_path=Path(folder) / "vllm.log").start()
        try:
            server.wait_ready()
            print(f"vLLM {server.url}: API server pid {server.process.pid}, engine core pids "
                  f"{children(server.process.pid)}; {args.streams} streams x {args.tokens} tokens, median of "
                  f"{args.rounds} rounds")
            for size in sizes:
                words = " ".join(f"w{n}" for n in range(size))
                prompt = vocab.encode_harmony(f"<|start|>user<|message|>{words}")[:size - 2]
                prompt += vocab.encode_harmony("<|end|><|start|>assistant")[-2:]
                table(len(prompt), await measure(vocab, server, prompt, args))
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
