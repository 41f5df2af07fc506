"""Time to first token per turn of a long agent session: HTTP with previous_response_id, HTTP stateless, WebSocket.

    python benchmarks/ws_bench.py [--turns 40] [--result-chars 12500] [--repeat 5]

One 40-turn agent session (each turn: the model calls a tool; the client sends back a ~2.5k-token result), so the
prompt grows to ~100k tokens, run three ways against a real server (a subprocess, the scripted engine, which
answers at once: what is measured is the server's own work before the first token, plus the transport):

- http-previous: POST /v1/responses, streamed, `previous_response_id` and only the new item (`store: true`: the
  server loads the chain from its store and renders the whole conversation, from cached pieces);
- http-stateless: POST, streamed, `store: false`, the whole conversation as `input` every turn;
- websocket: one connection, `response.create` with `previous_response_id` and only the new item, `store:
  false` (the connection extends the last turn's prompt tokens: parsers/continuation.py).

Time to first token is measured at the client, from sending the request (its body already encoded) to the first
delta event. Printed: the per-turn figure at a few turns, the best of --repeat sessions (the machines here are
shared and noisy; the best is the cost without interference), and for each transport the last five turns' mean
over the first five turns' (1.0: the cost does not grow with the session), then the same from the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-oss-20b"
CALL = ("<|channel|>analysis<|message|>I should read the next file.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.read_file <|constrain|>json<|message|>{"path":"src/next.py"}<|call|>')
TOOLS = [{"type": "function", "name": "read_file", "description": "Read a file of the repository.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
WORDS = ("def", "return", "self", "value", "import", "class", "for", "in", "if", "else", "result", "path", "line",
         "token", "stream", "request", "cache", "render", "parse", "error", "test", "assert", "None", "True")


def file_text(rng: random.Random, chars: int) -> str:
    lines, size = [], 0
    while size < chars:
        line = "    " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


class Server:
    def __init__(self, turns: int) -> None:
        self.folder = tempfile.TemporaryDirectory()
        script = Path(self.folder.name) / "script.jsonl"
        script.write_text("\n".join(json.dumps({"completion": CALL}) for _ in range(turns)) + "\n")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--engine", "scripted", "--script", str(script), "--port",
             str(self.port), "--store-path", str(Path(self.folder.name) / "store.sqlite3"), "--log-level", "warning",
             "--max-concurrent-requests", "4"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.folder.cleanup()


def first_delta(event: dict[str, Any]) -> bool:
    return event["type"].endswith(".delta")


async def http_session(server: Server, turns: int, results: list[str], stateless: bool) -> list[tuple[float, int]]:
    figures = []
    conversation: list[Any] = [{"role": "user", "content": "Read the repository's files one by one."}]
    previous = None
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        for turn in range(turns):
            body: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "stream": True, "instructions": "You are an agent."}
            if stateless:
                body |= {"store": False, "input": conversation}
            else:
                body |= {"store": True, "input": conversation[-1:] if previous else conversation}
                if previous:
                    body["previous_response_id"] = previous
            content = json.dumps(body).encode()
            started, ttft, final = time.perf_counter(), None, None
            async with client.stream("POST", "/v1/responses", content=content,
                                     headers={"content-type": "application/json"}) as reply:
                async for line in reply.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if ttft is None and first_delta(event):
                        ttft = time.perf_counter() - started
                    if event["type"] == "response.completed":
                        final = event["response"]
            assert ttft is not None and final is not None
            figures.append((ttft, final["usage"]["input_tokens"]))
            previous = final["id"]
            call = next(item for item in final["output"] if item["type"] == "function_call")
            conversation += final["output"]
            conversation.append({"type": "function_call_output", "call_id": call["call_id"], "output": results[turn]})
    return figures


async def ws_session(server: Server, turns: int, results: list[str]) -> list[tuple[float, int]]:
    figures = []
    new: list[Any] = [{"role": "user", "content": "Read the repository's files one by one."}]
    previous = None
    async with websockets.connect(server.url.replace("http", "ws") + "/v1/responses", max_size=None) as connection:
        for turn in range(turns):
            message: dict[str, Any] = {"type": "response.create", "model": MODEL, "tools": TOOLS, "store": False,
                                       "instructions": "You are an agent.", "input": new}
            if previous:
                message["previous_response_id"] = previous
            text = json.dumps(message)
            started, ttft, final = time.perf_counter(), None, None
            await connection.send(text)
            while final is None:
                event = json.loads(await connection.recv())
                if ttft is None and first_delta(event):
                    ttft = time.perf_counter() - started
                if event["type"] == "response.completed":
                    final = event["response"]
                elif event["type"] in ("error", "response.failed"):
                    raise RuntimeError(event)
            assert ttft is not None
            figures.append((ttft, final["usage"]["input_tokens"]))
            previous = final["id"]
            call = next(item for item in final["output"] if item["type"] == "function_call")
            new = [{"type": "function_call_output", "call_id": call["call_id"], "output": results[turn]}]
    return figures


def run(mode: str, turns: int, results: list[str]) -> list[tuple[float, int]]:
    server = Server(turns)
    try:
        if mode == "websocket":
            return asyncio.run(ws_session(server, turns, results))
        return asyncio.run(http_session(server, turns, results, stateless=mode == "http-stateless"))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--result-chars", type=int, default=12_500, help="size of each tool result (~4 chars a token)")
    parser.add_argument("--repeat", type=int, default=5, help="sessions per transport")
    args = parser.parse_args()
    rng = random.Random(0)
    results = [file_text(rng, args.result_chars) for _ in range(args.turns)]
    modes = ("http-previous", "http-stateless", "websocket")
    runs: dict[str, list[list[tuple[float, int]]]] = {mode: [] for mode in modes}
    for _ in range(args.repeat):
        for mode in modes:  # interleaved, so drift of the machine touches all three alike
            runs[mode].append(run(mode, args.turns, results))
    tokens = [runs["websocket"][0][turn][1] for turn in range(args.turns)]
    for name, pick in (("best", min), ("median", statistics.median)):
        ttft = {mode: [pick(r[turn][0] for r in runs[mode]) * 1000 for turn in range(args.turns)] for mode in modes}
        report(f"time to first token per turn, ms, {name} of {args.repeat} sessions (scripted engine, answers at "
               "once)", ttft, tokens, modes, args.turns)


def report(title: str, ttft: dict[str, list[float]], tokens: list[int], modes: tuple[str, ...], turns: int) -> None:
    print(title)
    print(f"{'turn':>5} {'prompt tokens':>14} " + " ".join(f"{mode:>15}" for mode in modes))
    for turn in sorted({0, 1, 4, 9, 19, 29, turns - 1} & set(range(turns))):
        print(f"{turn + 1:>5} {tokens[turn]:>14,} " + " ".join(f"{ttft[mode][turn]:>15.2f}" for mode in modes))
    head, tail = slice(0, 5), slice(turns - 5, turns)
    means = {mode: (statistics.mean(ttft[mode][head]), statistics.mean(ttft[mode][tail])) for mode in modes}
    print(f"{'mean, turns 1-5':>20} " + " ".join(f"{means[m][0]:>15.2f}" for m in modes))
    print(f"{'mean, last 5':>20} " + " ".join(f"{means[m][1]:>15.2f}" for m in modes))
    print(f"{'last 5 / first 5':>20} " + " ".join(f"{means[m][1] / means[m][0]:>15.2f}" for m in modes))
    print(f"{'last 5 / websocket':>20} " + " ".join(f"{means[m][1] / means['websocket'][1]:>15.2f}" for m in modes))
    print()

if __name__ == "__main__":
    main()
