"""Slowloris on loopback: how many idle, slow-head and slow-body connections a server still holds after a while,
and whether new clients get in while an attacker holds more sockets than the descriptor limit allows.

    .venv/bin/python benchmarks/slow_clients.py [--baseline-root DIR] [--each 300] [--hold 15] [--flood 1100]

Each server is `python -m proxy serve --engine mock` started with a descriptor limit of 1,024 (soft and hard, as on
many hosts). The probe opens `--each` connections of each kind (silent; a request head stopped half way; a complete
head whose body stops after 10 bytes), waits `--hold` seconds and counts those still open. Then it opens `--flood`
silent connections at once and times 5 GET /health requests from new clients (3 s each at most). With
`--baseline-root` (a checkout of an earlier commit, e.g. `git archive f37137c | tar -x -C /tmp/base`) the same
probe runs against that server first, and each figure is printed next to it. Everything is bounded: each server
is stopped at the end, every socket closed.
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def start(root: Path, port: int) -> subprocess.Popen[bytes]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    command = [sys.executable, "-m", "proxy", "serve", "--engine", "mock", "--no-store", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=root, preexec_fn=limit,  # noqa: PLW1509 (setrlimit, a C call)
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the server in {root} did not start")


def still_open(connection: socket.socket) -> bool:
    try:
        while data := connection.recv(65536):
            del data
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def opened(port: int, count: int, first_bytes: bytes) -> list[socket.socket]:
    connections = []
    for _ in range(count):
        try:
            connection = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            continue  # not accepted at all: not held either
        if first_bytes:
            connection.send(first_bytes)
        connection.setblocking(False)
        connections.append(connection)
    return connections


def probe(root: Path, each: int, hold: float, flood: int) -> dict[str, float]:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    process = start(root, port)
    figures: dict[str, float] = {}
    try:
        kinds = {"silent": b"", "slow head": HEAD, "slow body": HEAD + b"Content-Length: 100\r\n\r\n{\"model\":"}
        held = {kind: opened(port, each, first) for kind, first in kinds.items()}
        time.sleep(hold)
        for kind, connections in held.items():
            figures[f"{kind}: held after {hold:g} s (of {each})"] = sum(still_open(c) for c in connections)
            for connection in connections:
                connection.close()
        time.sleep(1)
        attackers = opened(port, flood, b"")
        served, took = 0, []
        for _ in range(5):
            asked = time.monotonic()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=3).status_code == 200:
                    served += 1
                    took.append(time.monotonic() - asked)
            except httpx.TransportError:
                pass
        figures[f"new clients served with {flood} idle sockets open (of 5)"] = served
        figures["their mean time (s)"] = round(sum(took) / len(took), 3) if took else float("nan")
        for connection in attackers:
            connection.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    return figures


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--baseline-root", type=Path, help="a checkout of the server to compare with")
    options.add_argument("--each", type=int, default=300)
    options.add_argument("--hold", type=float, default=15.0)
    options.add_argument("--flood", type=int, default=1100)
    args = options.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3 * args.each + args.flood + 64:  # the probe's own sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 3 * args.each + args.flood + 64), hard))
    ours = probe(ROOT, args.each, args.hold, args.flood)
    baseline = probe(args.baseline_root, args.each, args.hold, args.flood) if args.baseline_root else None
    for name, value in ours.items():
        if baseline is None:
            print(f"{name:60} {value:>8}")
        else:
            print(f"{name:60} ours {value:>6}   baseline {baseline[name]:>6}")


if __name__ == "__main__":
    main()
