"""A sealed reasoning blob replayed many times in one request, against plain text of the same body size, in the
same run and on the same server: how long the request takes, how long a concurrent GET /health waits, and how much
the server process grows (its peak RSS over the request, from /proc).

    python benchmarks/sealed_replay.py [--copies 1600] [--tokens 30000] [--path /v1/responses/input_tokens]

The blob is made with the server's own sealer (proxy/responses/sealing.py) under the key the server is started
with: `--tokens` repetitive reasoning tokens (gpt-oss writes long, repetitive analyses), a few hundred characters.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from proxy.responses.sealing import Sealer
from tests.conftest import MODEL
from tests.test_request_stalls import HealthWatch
from tests.test_store_processes import ServerProcess
from tests.waiting import process_cpu

KEY = "replay-benchmark-key-0123456789"


def replay_body(copies: int, tokens: int, key: str = KEY) -> dict[str, Any]:
    """A question, then `copies` reasoning items carrying the same blob (after the user message: all are opened)."""
    blob = Sealer(key).seal_reasoning([1000 + index % 40 for index in range(tokens)], "")
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": blob}
    return {"model": MODEL, "input": [{"role": "user", "content": "hi"}, *[reasoning] * copies]}


def plain_body(size: int) -> dict[str, Any]:
    """A message of about `size` bytes of ordinary text: a body the size of the replay's."""
    words = ("the quick brown fox jumps over a lazy dog " * (size // 42 + 1))[:size]
    return {"model": MODEL, "input": [{"role": "user", "content": "hi"}, {"role": "user", "content": words}]}


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def measure(server: ServerProcess, path: str, body: bytes) -> dict[str, Any]:
    """One request: its status, time and the server's CPU time for it, the longest /health meanwhile and the most CPU
    the server's event loop spent in one of those round trips (`held`), and the process's peak RSS growth."""
    pid = server.process.pid
    with httpx.Client(timeout=300) as client:
        client.get(server.url + "/health")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) to the current RSS
        before = rss_kib(pid)
        with HealthWatch(server.url, pid) as watch:
            time.sleep(0.05)
            started, cpu = time.perf_counter(), process_cpu(pid)
            response = client.post(server.url + path, content=body, headers={"content-type": "application/json"})
            took, cpu = time.perf_counter() - started, process_cpu(pid) - cpu
            time.sleep(0.05)
    error = response.json().get("error") or {} if response.status_code != 200 else {}
    return {"status": response.status_code, "code": error.get("code"), "seconds": took, "cpu_seconds": cpu,
            "health": watch.longest, "held": watch.held, "grew_mb": (rss_kib(pid, "VmHWM") - before) / 1024}


def run(path: str, copies: int, tokens: int, *options: str) -> dict[str, dict[str, Any]]:
    """Plain text, then the replay, on one fresh server: their figures by name."""
    replay = json.dumps(replay_body(copies, tokens), separators=(",", ":")).encode()
    plain = json.dumps(plain_body(len(replay) - 100), separators=(",", ":")).encode()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        server = ServerProcess(None, folder / "store.sqlite3", folder / "server.log", "--reasoning-key", KEY,
                               *options)
        try:
            return {"plain text": {**measure(server, path, plain), "bytes": len(plain)},
                    "replay": {**measure(server, path, replay), "bytes": len(replay)}}
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1600)
    parser.add_argument("--tokens", type=int, default=30000)
    parser.add_argument("--path", default="/v1/responses/input_tokens")
    args = parser.parse_args()
    figures = run(args.path, args.copies, args.tokens)
    print(f"{args.path}: {args.copies} copies of a blob of {args.tokens} tokens, "
          f"{figures['replay']['bytes'] / 1e3:.0f} kB (plain text: {figures['plain text']['bytes'] / 1e3:.0f} kB)")
    for name, figure in figures.items():
        print(f"  {name:10} {figure['status']} {figure['code'] or '':24} {figure['seconds']:7.2f} s, /health "
              f"at most {figure['health'] * 1000:7.0f} ms, peak RSS +{figure['grew_mb']:7.1f} MB")
    base, replayed = figures["plain text"], figures["replay"]
    print(f"  replay / plain: time x{replayed['seconds'] / base['seconds']:.2f}, /health "
          f"x{replayed['health'] / max(base['health'], 1e-3):.2f}, RSS growth "
          f"x{replayed['grew_mb'] / max(base['grew_mb'], 1.0):.2f}")


if __name__ == "__main__":
    main()
