"""What a WebSocket connection keeps (proxy/responses/turns.py) at its limits, counted by tracemalloc: `--turns`
pre-warms (`generate: false`: planned and remembered as the connection does, no engine work) of about `--tokens`
prompt tokens each, all different, on each of `--connections` connections; then the same after they close.

    python benchmarks/ws_turn_memory.py [--connections 2] [--turns 32] [--tokens 100000]

The renderer's piece cache (server-wide, bounded by tokens) is filled to its bound first with other texts, so
that what grows is what the connections keep. Prints the bytes per connection next to the per-connection budget
(CONNECTION_BYTES), as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from parsers.render import Renderer
from parsers.vocab import load_vocab
from proxy.responses.request.parse import parse_responses_request
from proxy.responses.request.unseal import Unsealer
from proxy.responses.sealing import Sealer
from proxy.responses.turns import CONNECTION_BYTES, TurnMemory, Turns, plan

MODEL = "openai/gpt-oss-20b"
WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact be have do say get make go know take see come think look "
         "want give use find tell ask work seem feel try leave call good new first last long great little own "
         "other old right big high different small large next early young important few public bad same able")


def text_of(tokens: int, seed: int) -> str:
    """About `tokens` tokens of words, different for each seed (nothing shared in the renderer's cache)."""
    chooser, words = random.Random(seed), WORDS.split()
    return " ".join(f"{chooser.choice(words)}{chooser.randrange(100)}" for _ in range(tokens // 2))



def prewarm(renderer: Renderer, turns: Turns, response_id: str, text: str) -> None:
    """A `generate: false` create of `text`: parsed, planned and remembered as the connection does."""
    request = parse_responses_request({"model": MODEL, "input": text, "store": False}, "medium", MODEL)
    unsealer = Unsealer(Sealer("turn-memory-benchmark-key"), 131072)
    made = asyncio.run(plan(renderer, unsealer, request, None, [], request.input_items, generate=False))
    turns.remember(response_id, made, [])


def fill_renderer_cache(renderer: Renderer, tokens: int = 1_200_000, each: int = 100_000) -> None:
    """Render `tokens` tokens of texts no connection sends: the renderer's cache is then at its bound."""
    for seed in range(tokens // each):
        prewarm(renderer, Turns(lambda: None, TurnMemory(), max_bytes=0), "resp_fill", text_of(each, -1 - seed))


def held_by_connections(renderer: Renderer, connections: int, turns: int, tokens: int,
                        each: int = 100_000) -> tuple[int, int, int]:
    """(bytes allocated and still held with every connection's turns kept, the same after they closed, the bytes
    the budget counted). Traced from before the renderer's cache is filled (`each` tokens a text): tracemalloc
    credits only the frees of what it saw allocated, and the cache frees what it evicts."""
    memory = TurnMemory()
    tracemalloc.start()
    try:
        fill_renderer_cache(renderer, each=each)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        kept = [Turns(lambda: None, memory) for _ in range(connections)]
        for number, connection in enumerate(kept):
            for turn in range(turns):
                prewarm(renderer, connection, f"resp_{number}_{turn}", text_of(tokens, number * 1000 + turn))
        gc.collect()
        held, counted = tracemalloc.get_traced_memory()[0] - before, memory.used
        for connection in kept:
            connection.close()
        del kept
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held, left, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=100_000)
    args = parser.parse_args()
    renderer = Renderer(load_vocab())
    started = time.perf_counter()
    held, left, counted = held_by_connections(renderer, args.connections, args.turns, args.tokens)
    per_connection = held / args.connections / 2**20
    budget = CONNECTION_BYTES / 2**20
    print(f"{args.connections} connections x {args.turns} pre-warms of ~{args.tokens} tokens "
          f"({time.perf_counter() - started:.0f} s)")
    print(f"  held per connection: {per_connection:.1f} MiB (budget {budget:.0f} MiB: x{per_connection / budget:.2f}; "
          f"counted by the budget {counted / args.connections / 2**20:.1f} MiB); left after close: "
          f"{left / 2**20:.2f} MiB in all")


if __name__ == "__main__":
    main()
