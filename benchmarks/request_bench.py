"""What a request costs before the engine sees it: parse + render, and how long it holds the event loop.

    python benchmarks/request_bench.py [--repeat N] [--skip-stalls] [--switch-interval-ms MS] [--gc-freeze]

1. Parse + render of a Chat Completions body holding an ~8k-token agent conversation and 20 tools, in process:
   - cold: the server has seen neither the tools nor the conversation (new caches every run);
   - known tools, new conversation: another conversation with the same tools came before;
   - repeated turn: the previous turn of this conversation came before (the new turn adds two messages).
   "previous" is the same code with this work's fast paths off, measured in the same run: every tool schema
   checked by jsonschema's `check_schema`, every message by jsonschema, nothing reused by the renderer.
2. The longest the event loop stalls (an asyncio ticker records the largest gap between its 0.5 ms sleeps)
   while one request of the largest allowed size is decoded, parsed and rendered: inline, as before, and
   through `read_and_parse` + `Renderer.render_off_loop` as the routes now do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from starlette.requests import Request

import proxy.chat.request as chat_request
from parsers.render import Renderer
from parsers.vocab import Vocab, load_vocab
from proxy.chat.request import parse_chat_request
from proxy.validation import MAX_BODY_BYTES, CompiledSchema, decode_json_object, read_and_parse
from tools import schema_check
from tools.cache import MAX_TOOLS, MAX_TOOLS_SCHEMA_BYTES, ToolCatalog

WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this",
         "are", "or", "from", "at", "which", "an", "have", "not", "can", "all", "model", "server", "request",
         "token", "stream", "agent", "tool", "call", "result", "value", "error", "cache", "render", "parse",
         "schema", "function", "weather", "city", "forecast", "search", "query", "return", "update", "record",
         "list", "file", "path", "line", "code", "test")


def prose(rng: random.Random, words: int) -> str:
    out = []
    for position in range(words):
        word = rng.choice(WORDS)
        out.append(word.capitalize() if position % 14 == 0 else word)
        if position % 14 == 13:
            out[-1] += "." if rng.random() < 0.8 else ".\n"
    return " ".join(out)


def agent_tools(count: int, seed: int = 0, size: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tools = []
    for index in range(count):
        properties: dict[str, Any] = {"query": {"type": "string", "description": prose(rng, 8)}}
        for extra in range(size - 1):
            properties[f"option_{extra}"] = rng.choice([
                {"type": "integer", "minimum": 1, "maximum": 100, "description": prose(rng, 6)},
                {"type": "string", "enum": ["fast", "exact", "fuzzy"]},
                {"type": "array", "items": {"type": "string"}, "description": prose(rng, 5)},
                {"type": "boolean", "description": prose(rng, 4)},
            ])
        tools.append({"type": "function", "function": {
            "name": f"tool_{seed}_{index}", "description": prose(rng, 20),
            "parameters": {"type": "object", "properties": properties, "required": ["query"],
                           "additionalProperties": False}}})
    return tools


def conversation(seed: int, turns: int) -> list[dict[str, Any]]:
    """A system prompt, then per turn: user, assistant reasoning + tool call, tool result, assistant answer."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": prose(rng, 500)}]
    for turn in range(turns):
        call_id = f"call_{seed}_{turn}"
        messages += [
            {"role": "user", "content": prose(rng, 90)},
            {"role": "assistant", "content": None, "reasoning_content": prose(rng, 50), "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": f"tool_0_{turn % 20}", "arguments": json.dumps({"query": prose(rng, 6)})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": prose(rng, 170)},
            {"role": "assistant", "content": prose(rng, 70)},
        ]
    return messages


def body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "openai/gpt-oss-20b", "messages": messages, "tools": tools}).encode()


def next_turn(messages: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [*messages, {"role": "user", "content": prose(rng, 40)}]


@contextlib.contextmanager
def previous_design() -> Iterator[None]:
    """This code with its fast paths off: jsonschema checks everything (the renderer is made without reuse)."""
    def unsure(_: Any) -> bool:
        return False

    saved = chat_request._REQUEST, chat_request._MESSAGE, schema_check._ACCEPTS
    chat_request._REQUEST = CompiledSchema(saved[0].validator, unsure)
    chat_request._MESSAGE = {role: CompiledSchema(s.validator, unsure) for role, s in saved[1].items()}
    schema_check._ACCEPTS = unsure
    try:
        yield
    finally:
        chat_request._REQUEST, chat_request._MESSAGE, schema_check._ACCEPTS = saved


def parse_and_render(renderer: Renderer, raw: bytes) -> tuple[float, float, int]:
    start = time.perf_counter()
    chat = parse_chat_request(decode_json_object(raw), "medium", renderer.tools)
    middle = time.perf_counter()
    tokens = renderer.render(chat.prompt)
    return (middle - start) * 1e3, (time.perf_counter() - middle) * 1e3, len(tokens)


def median_of(runs: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), runs[0][2]


def fresh(vocab: Vocab, reuse: bool) -> Renderer:
    if reuse:
        return Renderer(vocab)
    return Renderer(vocab, ToolCatalog(max_entries=0), cache_tokens=0)


def request_costs(vocab: Vocab, repeat: int) -> None:
    tools = agent_tools(20)
    base = conversation(1, 12)
    raw = body(base, tools)
    print(f"Workload: {len(raw) / 1024:.0f} KiB body, {len(base)} messages, {len(tools)} tools, "
          f"{parse_and_render(fresh(vocab, False), raw)[2]} prompt tokens; median of {repeat} runs\n")

    def cold(reuse: bool) -> tuple[float, float, int]:
        return median_of([parse_and_render(fresh(vocab, reuse), raw) for _ in range(repeat)])

    def new_conversation(reuse: bool) -> tuple[float, float, int]:
        renderer = fresh(vocab, reuse)
        parse_and_render(renderer, raw)
        return median_of([parse_and_render(renderer, body(conversation(100 + run, 12), tools))
                          for run in range(repeat)])

    def repeated_turn(reuse: bool) -> tuple[float, float, int]:
        renderer = fresh(vocab, reuse)
        parse_and_render(renderer, raw)
        return median_of([parse_and_render(renderer, body(next_turn(base, run), tools)) for run in range(repeat)])

    print(f"{'parse + render, ms':34} {'ours':>22} {'previous':>22} {'previous/ours':>14}")
    for name, scenario in (("cold", cold), ("known tools, new conversation", new_conversation),
                           ("repeated turn", repeated_turn)):
        ours = scenario(True)
        with previous_design():
            before = scenario(False)
        cell = [f"{p + r:6.2f} ({p:5.2f} + {r:5.2f})" for p, r, _ in (ours, before)]
        print(f"{name:34} {cell[0]:>22} {cell[1]:>22} {(before[0] + before[1]) / (ours[0] + ours[1]):13.1f}x")
    print("(parse + render in brackets; parse includes JSON decoding)\n")


# -- event loop stalls ------------------------------------------------------------------------------------------

async def _ticker(gaps: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.0005)
        now = time.perf_counter()
        gaps.append(now - last - 0.0005)
        last = now


async def _stall(work: Callable[[], Any]) -> tuple[float, float]:
    gaps: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(gaps, stop))
    await asyncio.sleep(0.02)
    gaps.clear()
    start = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - start
    stop.set()
    await ticker
    return elapsed * 1e3, max(gaps) * 1e3


def _request(raw: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": [(b"content-length", str(len(raw)).encode())]}
    return Request(scope, receive)


def stalls(vocab: Vocab) -> None:
    rng = random.Random(7)
    many: list[dict[str, Any]] = []
    while sum(len(m["content"]) + 40 for m in many) < MAX_BODY_BYTES - 200_000:
        many.append({"role": "user" if len(many) % 2 == 0 else "assistant", "content": prose(rng, 120)})
    one = [{"role": "user", "content": prose(rng, (MAX_BODY_BYTES - 200_000) // 6)}]
    big_tools = agent_tools(MAX_TOOLS, seed=3, size=90)
    while len(json.dumps(big_tools)) > MAX_TOOLS_SCHEMA_BYTES - 4096:
        big_tools.pop()
    cases = [
        (f"{len(many)} messages", body(many, [])),
        ("one long user message", body(one, [])),
        (f"{len(big_tools)} tools, {len(json.dumps(big_tools)) // 1024} KiB of schemas", body(many[:2], big_tools)),
        ("the 8k-token conversation, 20 tools", body(conversation(1, 12), agent_tools(20))),
    ]
    frozen = ", startup objects frozen (gc.freeze)" if gc.get_freeze_count() else ""
    print(f"Event loop stalls (switch interval {sys.getswitchinterval() * 1e3:.0f} ms{frozen}); new caches every run")
    print(f"{'request':38} {'KiB':>6} {'inline: total, max stall ms':>30} {'off-loop: total, max stall ms':>31}")
    for name, raw in cases:
        async def inline(raw: bytes = raw) -> None:
            renderer = Renderer(vocab)
            chat = parse_chat_request(decode_json_object(raw), "medium", renderer.tools)
            renderer.render(chat.prompt)

        async def off_loop(raw: bytes = raw) -> None:
            renderer = Renderer(vocab)
            chat = await read_and_parse(_request(raw), lambda b: parse_chat_request(b, "medium", renderer.tools))
            await renderer.render_off_loop(chat.prompt)

        before, after = asyncio.run(_stall(inline)), asyncio.run(_stall(off_loop))
        print(f"{name:38} {len(raw) // 1024:6d} {before[0]:16.1f} {before[1]:13.1f} {after[0]:17.1f} {after[1]:13.1f}")

    async def hops() -> float:
        await asyncio.to_thread(int)
        start = time.perf_counter()
        for _ in range(200):
            await asyncio.to_thread(int)
        return (time.perf_counter() - start) / 200 * 1e6

    print(f"\nA worker thread hop (asyncio.to_thread), there and back: {asyncio.run(hops()):.0f} us")
    start = time.perf_counter()
    gc.collect()
    full = (time.perf_counter() - start) * 1e3
    gc.freeze()
    start = time.perf_counter()
    gc.collect()
    print(f"A full garbage collection (it runs on whichever thread allocates, GIL held): {full:.1f} ms; "
          f"after gc.freeze(): {(time.perf_counter() - start) * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--skip-stalls", action="store_true")
    parser.add_argument("--switch-interval-ms", type=float, help="sys.setswitchinterval for the stall runs")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() once the vocabulary is loaded")
    args = parser.parse_args()
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    vocab = load_vocab()
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    request_costs(vocab, args.repeat)
    if not args.skip_stalls:
        stalls(vocab)


if __name__ == "__main__":
    main()
