"""What crossing the process boundary costs per token: the engine host (proxy/engines/host.py) and its front
end (RemoteEngine, proxy/engines/remote.py) against the same engine called in-process, in the same run.

    python benchmarks/ipc_bench.py [--streams 16 256] [--tokens 400] [--rounds 3]

The engine is the playback engine with no delay, the cheapest engine there is, so the ratio printed is the
worst case: a real engine's own per-token work adds to both sides. Each stream plays `--tokens` tokens, one or
ten a step (TensorRT-LLM's stream_interval), and all streams run at once. The consumer only counts tokens.

Server CPU per token is CPU time over tokens: in process, this process's; over IPC, this process's (the front
end) plus the host process's (its threads' run time from /proc, in nanoseconds). The best of `--rounds`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.engines.base import Engine, GenerationRequest, SamplingParams
from proxy.engines.host import run_engine_host
from proxy.engines.playback import PlaybackEngine
from proxy.engines.remote import RemoteEngine


def playback_engine(tokens: int, tokens_per_step: int) -> Engine:
    """The engine both sides run; module-level so a spawned host process can build it."""
    completion = [1000 + index % 5000 for index in range(tokens)]
    return PlaybackEngine("playback", lambda request: completion, 0.0, tokens_per_step)


@dataclass
class Cost:
    tokens: int
    seconds: float
    front_cpu: float  # this process
    host_cpu: float = 0.0  # the engine host process

    @property
    def per_token_us(self) -> float:
        return (self.front_cpu + self.host_cpu) / self.tokens * 1e6


async def consume(engine: Engine, streams: int, tokens: int) -> int:
    async def one(number: int) -> int:
        request = GenerationRequest(f"bench-{number}", [1, 2, 3], SamplingParams(max_tokens=tokens, ignore_eos=True))
        received = 0
        async for step in engine.generate(request):
            received += len(step.token_ids)
        return received

    return sum(await asyncio.gather(*(one(number) for number in range(streams))))


async def measure(engine: Engine, streams: int, tokens: int, host_pid: int | None) -> Cost:
    host_before = host_cpu_seconds(host_pid)
    cpu, wall = time.process_time(), time.perf_counter()
    received = await consume(engine, streams, tokens)
    cost = Cost(received, time.perf_counter() - wall, time.process_time() - cpu)
    cost.host_cpu = host_cpu_seconds(host_pid) - host_before
    assert received == streams * tokens, f"received {received} tokens of {streams * tokens}"
    return cost


def host_cpu_seconds(pid: int | None) -> float:
    """CPU time of all threads of process `pid`, from /proc/PID/task/*/schedstat (nanoseconds)."""
    if pid is None:
        return 0.0
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


async def best_of(rounds: int, run: Callable[[], Awaitable[Cost]]) -> Cost:
    costs = [await run() for _ in range(rounds)]
    return min(costs, key=lambda cost: cost.per_token_us)


async def compare(streams: int, tokens: int, per_step: int, rounds: int, socket_path: str, host_pid: int) -> None:
    local = playback_engine(tokens, per_step)
    baseline = await best_of(rounds, lambda: measure(local, streams, tokens, None))
    remote = RemoteEngine(socket_path, name="playback", retry_interval=0.05)
    await remote.start()
    while not remote.ready:
        await asyncio.sleep(0.05)
    try:
        await measure(remote, min(streams, 8), tokens, host_pid)  # warm up both processes
        crossed = await best_of(rounds, lambda: measure(remote, streams, tokens, host_pid))
    finally:
        await remote.close()
    added = crossed.per_token_us - baseline.per_token_us
    print(
        f"{streams:>7} {per_step:>8} | {baseline.per_token_us:9.2f} {baseline.tokens / baseline.seconds / 1e3:9.0f}k"
        f" | {crossed.front_cpu / crossed.tokens * 1e6:8.2f} {crossed.host_cpu / crossed.tokens * 1e6:8.2f}"
        f" {crossed.per_token_us:8.2f} {crossed.tokens / crossed.seconds / 1e3:8.0f}k"
        f" | {crossed.per_token_us / baseline.per_token_us:5.2f}x {added:+8.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 256], help="concurrent streams")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per stream")
    parser.add_argument("--rounds", type=int, default=3, help="runs per figure; the best is printed")
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop  # as the front ends (uvicorn) and the host run
    except ImportError:
        loop_factory = None
    print("server CPU us/token; in process vs. over IPC (front end + engine host); throughput in tokens/s")
    print(f"{'streams':>7} {'tok/step':>8} | {'in-proc':>9} {'tok/s':>10} | {'front':>8} {'host':>8} {'total':>8}"
          f" {'tok/s':>9} | {'ratio':>6} {'added':>8}")
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ipc-bench-") as folder:
        for per_step in (1, 10):
            socket_path = os.path.join(folder, f"engine-{per_step}.sock")
            build = functools.partial(playback_engine, args.tokens, per_step)
            host = context.Process(target=run_engine_host, args=(build, socket_path), daemon=True)
            host.start()
            try:
                for streams in args.streams:
                    with asyncio.Runner(loop_factory=loop_factory) as runner:
                        runner.run(compare(streams, args.tokens, per_step, args.rounds, socket_path, host.pid))
            finally:
                host.terminate()
                host.join(10)


if __name__ == "__main__":
    main()
