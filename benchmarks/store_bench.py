"""The store's operations, SQLite against PostgreSQL, from one process, side by side in one run.

    .venv/bin/python benchmarks/store_bench.py [--store-url postgresql://...] [--turns N] [--concurrency N]

Without --store-url it starts a PostgreSQL server of its own (tests/postgres.py: Debian's `postgresql`, in a
temporary folder, fsync off as in the tests). A workload of agent-like chains, each turn a response saved in
progress, then finished, its chain read back (`history`) and the response loaded, runs on each backend with
`--concurrency` chains at once; it prints each operation's p50 and p99 in milliseconds and the turns per second,
and PostgreSQL's figures as a ratio to SQLite's (the embedded baseline). PostgreSQL pays a loopback round trip
or several per operation, and lets unrelated writes run at once; SQLite runs every operation on one thread.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from proxy.store.base import ResponseStore, StoredResponse
from proxy.store.postgres import PostgresResponseStore
from proxy.store.sqlite import SQLiteResponseStore

OPERATIONS = ("save", "history", "load")


def _record(chain: int, turn: int, done: bool) -> StoredResponse:
    text = f"answer {chain}/{turn} " + "word " * 200  # about 1 kB of output per turn
    resource = {"id": f"resp_{chain}_{turn}", "object": "response", "created_at": turn,
                "status": "completed" if done else "in_progress",
                "previous_response_id": f"resp_{chain}_{turn - 1}" if turn else None,
                "output": [{"id": f"msg_{chain}_{turn}", "type": "message", "role": "assistant",
                            "status": "completed", "content": [{"type": "output_text", "text": text}]}]}
    question = {"id": f"in_{chain}_{turn}", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": f"question {chain}/{turn}"}]}
    return StoredResponse(resource, [question])


async def _workload(store: ResponseStore, chains: int, turns: int) -> tuple[dict[str, list[float]], float]:
    times: dict[str, list[float]] = {name: [] for name in OPERATIONS}

    async def timed(name: str, work: Any) -> Any:
        started = time.perf_counter()
        result = await work
        times[name].append(time.perf_counter() - started)
        return result

    async def chain(number: int) -> None:
        for turn in range(turns):
            await timed("save", store.save(_record(number, turn, False)))
            await timed("save", store.save(_record(number, turn, True)))
            history = await timed("history", store.history(f"resp_{number}_{turn}"))
            assert len(history) == 2 * (turn + 1)
            await timed("load", store.load(f"resp_{number}_{turn}"))

    started = time.perf_counter()
    await asyncio.gather(*(chain(number) for number in range(chains)))
    return times, time.perf_counter() - started


def _ms(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000


async def _run(url: str, folder: Path, chains: int, turns: int) -> None:
    results = {}
    for name, store in (("sqlite", SQLiteResponseStore(folder / "bench.sqlite3")),
                        ("postgres", PostgresResponseStore(url))):
        await store.open()
        results[name] = await _workload(store, chains, turns)
        await store.close()
    print(f"{chains} chains at once, {turns} turns each: ms per operation (p50 / p99), PostgreSQL / SQLite")
    for operation in OPERATIONS:
        line = [f"{operation:8}"]
        for name in ("sqlite", "postgres"):
            values = results[name][0][operation]
            line.append(f"{name} {_ms(values, 0.5):6.2f} / {_ms(values, 0.99):6.2f}")
        medians = {name: statistics.median(results[name][0][operation]) for name in results}
        ratio = medians["postgres"] / medians["sqlite"]
        print("  ".join(line) + f"  ratio p50 {ratio:.2f}")
    rates = {name: chains * turns / results[name][1] for name in results}
    print(f"turns/s  sqlite {rates['sqlite']:.0f}  postgres {rates['postgres']:.0f}  "
          f"ratio {rates['postgres'] / rates['sqlite']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store-url", help="a PostgreSQL database to use (default: start a server of our own)")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.store_url:
            asyncio.run(_run(args.store_url, Path(folder), args.concurrency, args.turns))
            return
        from tests.postgres import PostgresServer

        server = PostgresServer()
        server.start()
        try:
            asyncio.run(_run(server.new_database(), Path(folder), args.concurrency, args.turns))
        finally:
            server.remove()


if __name__ == "__main__":
    main()
