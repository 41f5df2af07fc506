"""How much compaction shrinks a long Codex-like session, and whether the next turn still works.

    python benchmarks/compaction.py [--turns N] [--calls-per-turn K] [--engine mock|scripted-file ...]

Starts the real server (`python -m proxy serve --engine mock`, a sealing key given) and builds the input a
stateless Codex session sends after N user turns: a ~17 KB developer message, Codex-like function tools, and per
turn K `exec_command` calls with their reasoning (sealed) and outputs (file listings, source, test logs), then
a final answer. It then measures, with the server's own `POST /v1/responses/input_tokens`:

- baseline: the next turn's prompt with the whole session;
- compacted: the next turn's prompt from `POST /v1/responses/compact`'s window (user messages + compaction item)
  after the developer instructions, and from the whole session with the compaction item appended (the same: the
  client may send either);
- the worst case: the compacted prompt with the summary at its cap (`SUMMARY_MAX_TOKENS`), since the mock engine
  (no weights) writes a short placeholder where gpt-oss would write its notes;

and runs the next turn on the compacted window (status, answer, prompt tokens). Figures are token counts, exact.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from proxy.responses.compaction import SUMMARY_MAX_TOKENS

MODEL = "openai/gpt-oss-20b"
KEY = "benchmark-reasoning-key-0123456789"
WORDS = ("the", "file", "test", "function", "returns", "error", "fix", "path", "module", "config", "value", "call",
         "should", "check", "output", "line", "import", "class", "server", "request", "parse", "cache", "update")
TOOLS = [
    {"type": "function", "name": "exec_command", "description": "Run a shell command and return its output.",
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"},
                                                     "timeout_ms": {"type": "integer"}}, "required": ["cmd"]}},
    {"type": "function", "name": "apply_patch", "description": "Apply a patch to files in the workspace.",
     "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}},
    {"type": "function", "name": "update_plan", "description": "Record the plan and the status of each step.",
     "parameters": {"type": "object", "required": ["plan"], "properties": {"plan": {"type": "array", "items": {
         "type": "object", "required": ["step", "status"], "properties": {
             "step": {"type": "string"},
             "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}}}}}}},
]


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def code(rng: random.Random, lines: int) -> str:
    return "\n".join(f"{'    ' * rng.randint(0, 2)}{rng.choice(WORDS)}_{rng.randint(0, 99)} = "
                     f"{rng.choice(WORDS)}({rng.choice(WORDS)}, {rng.randint(0, 999)})" for _ in range(lines))


def session(turns: int, calls_per_turn: int, seed: int = 0) -> list[dict[str, Any]]:
    """The items a stateless Codex sends back after `turns` user turns."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = [{"role": "developer", "content": prose(rng, 2600)}]  # ~17 KB, as Codex's
    for turn in range(turns):
        items.append({"role": "user", "content": f"Task {turn}: {prose(rng, 40)}"})
        for call in range(calls_per_turn):
            items.append({"type": "reasoning", "summary": [], "content": [
                {"type": "reasoning_text", "text": prose(rng, 120)}]})
            command = rng.choice(["cat src/module_{0}.py", "pytest -q tests/test_{0}.py", "rg -n parse src/",
                                  "ls -la src/"]).format(rng.randint(0, 40))
            call_id = f"call_{turn}_{call}"
            items.append({"type": "function_call", "call_id": call_id, "name": "exec_command",
                          "arguments": json.dumps({"cmd": command, "workdir": "/repo"})})
            items.append({"type": "function_call_output", "call_id": call_id, "output": code(rng, rng.randint(20, 80))})
        items.append({"type": "reasoning", "summary": [],
                      "content": [{"type": "reasoning_text", "text": prose(rng, 60)}]})
        items.append({"role": "assistant", "content": f"Done with task {turn}. {prose(rng, 50)}"})
    return items


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--calls-per-turn", type=int, default=4)
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "HARMONY_PROXY_REASONING_KEY": KEY}
    server = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--engine", "mock", "--port", str(port),
                               "--log-level", "warning"], env=env, cwd=Path(__file__).resolve().parent.parent)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        with httpx.Client(base_url=base, timeout=300) as client:
            for _ in range(300):
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            run(client, args.turns, args.calls_per_turn)
    finally:
        server.terminate()
        server.wait(timeout=30)


def run(client: httpx.Client, turns: int, calls_per_turn: int) -> None:
    items = session(turns, calls_per_turn)
    later = {"role": "user", "content": "Now run the whole test suite and fix what fails."}

    def count(input_items: list[dict[str, Any]]) -> int:
        response = client.post("/responses/input_tokens", json={"model": MODEL, "tools": TOOLS, "input": input_items})
        response.raise_for_status()
        return response.json()["input_tokens"]

    before = count([*items, later])
    started = time.perf_counter()
    compacted = client.post("/responses/compact", json={"model": MODEL, "tools": TOOLS, "input": items})
    compacted.raise_for_status()
    seconds = time.perf_counter() - started
    body = compacted.json()
    window = body["output"]
    summary_tokens = body["usage"]["output_tokens"]
    # Codex sends its developer instructions with every request, the compacted window after them.
    instructions = [item for item in items if item.get("role") == "developer"]
    after = count([*instructions, *window, later])
    after_whole = count([*items, window[-1], later])
    worst = after - summary_tokens + SUMMARY_MAX_TOKENS
    nxt = client.post("/responses", json={"model": MODEL, "tools": TOOLS, "input": [*instructions, *window, later],
                                                "store": False})
    nxt.raise_for_status()
    answer = nxt.json()
    text = "".join(part.get("text", "") for item in answer["output"] if item["type"] == "message"
                   for part in item["content"])

    print(f"session: {turns} user turns x {calls_per_turn} exec_command calls, {len(items)} items, "
          f"{len(json.dumps(items)) // 1024} KiB of JSON")
    print(f"{'':38}{'tokens':>10}{'ratio':>9}")
    print(f"{'baseline: next prompt, whole session':38}{before:>10}{1.0:>9.3f}")
    print(f"{'compacted window (mock summary)':38}{after:>10}{after / before:>9.3f}")
    print(f"{'whole session + compaction item':38}{after_whole:>10}{after_whole / before:>9.3f}")
    print(f"{'compacted, summary at its cap':38}{worst:>10}{worst / before:>9.3f}")
    print(f"summary: {summary_tokens} tokens generated from a {body['usage']['input_tokens']}-token prompt "
          f"in {seconds * 1000:.0f} ms (mock engine); compaction item {len(window[-1]['encrypted_content'])} chars")
    print(f"next turn on the compacted window: status {answer['status']}, prompt {answer['usage']['input_tokens']} "
          f"tokens (counted {after}), answer {text[:70]!r}")


if __name__ == "__main__":
    main()
