"""What a WebSocket connection remembers (proxy/responses/turns.py) has a byte budget that holds, per connection and
across the server, measured on what the turns really hold, and given back when the connection closes (issue 26,
item 2). Of the ~44 MB a connection seemed to cost, most was the renderer's piece cache, bounded and shared by
all connections (1M tokens); what the connection itself kept is measured here with tracemalloc."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from benchmarks.ws_turn_memory import MODEL, held_by_connections, prewarm, text_of
from parsers.render import Renderer
from parsers.vocab import Vocab
from proxy.responses.request.parse import parse_responses_request
from proxy.responses.request.unseal import Unsealer
from proxy.responses.sealing import Sealer
from proxy.responses.turns import CONNECTION_BYTES, TurnMemory, Turns, plan, turn_bytes


@pytest.fixture(scope="module")
def renderer(vocab: Vocab) -> Renderer:
    return Renderer(vocab)


def test_each_connection_and_the_server_keep_within_their_budgets(renderer: Renderer) -> None:
    probe = Turns(lambda: None, TurnMemory())  # type: ignore[arg-type, return-value]
    prewarm(renderer, probe, "resp_probe", text_of(20000, 99))
    one = probe.used  # one turn of ~20,000 tokens, about the same for each text below
    print(f"\na turn of {len(probe.get('resp_probe').rendered.tokens)} tokens: {one / 1024:.0f} KiB")
    memory = TurnMemory(budget=int(3.5 * one))
    first, second = (Turns(lambda: None, memory, max_bytes=int(2.5 * one)) for _ in range(2))  # type: ignore
    for number in range(6):
        prewarm(renderer, first, f"resp_a{number}", text_of(20000, number))
        assert first.used <= 2.5 * one and memory.used <= 3.5 * one
    assert [first.get(f"resp_a{number}") is not None for number in range(6)] == [False] * 4 + [True] * 2
    first.get("resp_a4")  # used again: the most recent of all
    for number in range(3):
        prewarm(renderer, second, f"resp_b{number}", text_of(20000, 100 + number))
        assert memory.used <= 3.5 * one and first.used + second.used == memory.used
    # the server's budget dropped the least recently used turn, on either connection
    assert first.get("resp_a5") is None and first.get("resp_a4") is not None
    assert [second.get(f"resp_b{number}") is not None for number in range(3)] == [False, True, True]


def test_a_turn_larger_than_the_budget_is_not_kept(renderer: Renderer) -> None:
    memory = TurnMemory()
    turns = Turns(lambda: Unsealer(Sealer("turn-memory-test-key-0123"), 131072), memory, max_bytes=64 << 10)
    prewarm(renderer, turns, "resp_big", text_of(20000, 7))
    assert turns.get("resp_big") is None and memory.used == 0


def test_closing_gives_everything_back(renderer: Renderer) -> None:
    memory = TurnMemory()
    turns = Turns(lambda: Unsealer(Sealer("turn-memory-test-key-0123"), 131072), memory)
    prewarm(renderer, turns, "resp_1", text_of(20000, 1))
    turn = turns.get("resp_1")
    assert turn is not None and turn.rendered is not None
    assert turn.rendered.tokens.itemsize == 4  # token ids kept as array('I')
    alive = weakref.ref(turn.rendered)
    del turn
    assert memory.used == turns.used > 0
    turns.close()
    gc.collect()
    assert memory.used == 0 and turns.used == 0 and alive() is None


def test_the_charged_size_is_at_least_what_the_turn_holds(renderer: Renderer) -> None:
    """tracemalloc's count of what remembering a turn kept (the renderer's caches filled before, by the same
    text) against the size the budget charged for it."""
    import tracemalloc

    text = text_of(20000, 3)
    prewarm(renderer, Turns(lambda: None, TurnMemory()), "resp_0", text)  # type: ignore[arg-type, return-value]
    turns = Turns(lambda: None, TurnMemory())  # type: ignore[arg-type, return-value]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        prewarm(renderer, turns, "resp_1", text)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    turn = turns.get("resp_1")
    assert turn is not None and turns.used == turn_bytes(turn)
    print(f"\ncharged {turns.used / 1024:.0f} KiB, allocated and kept {kept / 1024:.0f} KiB")
    assert kept <= turns.used <= 3 * kept


def test_a_connection_at_its_limits_holds_its_budget_and_gives_it_back(renderer: Renderer) -> None:
    """32 pre-warms of ~30,000 different tokens on one connection, counted by tracemalloc (7.4 MiB before, token
    ids as lists of ints): within CONNECTION_BYTES, counted high, and nothing is left once the connection closes.
    The renderer's cache is at its bound before, so that it does not grow meanwhile."""
    held, left, counted = held_by_connections(renderer, 1, 32, 30000, each=30000)
    print(f"\none connection at its limits: {held / 2**20:.1f} MiB held, {counted / 2**20:.1f} MiB counted "
          f"(budget {CONNECTION_BYTES / 2**20:.0f} MiB), {left / 2**20:.2f} MiB left after close")
    assert held <= counted <= CONNECTION_BYTES
    assert left < 1 << 20


def test_what_a_turn_keeps_unrendered_counts_too(renderer: Renderer) -> None:
    """Items that render to nothing are kept all the same (reasoning before the last user message, for the next
    request's history): 32 pre-warms each carrying 1 MB of it. Before, a turn weighed its prompt tokens alone
    (a few), so all 32 were kept: 32 MB; now the budget counts their bytes."""
    import tracemalloc

    memory = TurnMemory()
    turns = Turns(lambda: None, memory)  # type: ignore[arg-type, return-value]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for number in range(32):
            text = f"{number}" + "x" * 1_000_000
            thoughts = {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
            body = {"model": MODEL, "store": False, "input": [thoughts, {"role": "user", "content": "hi"}]}
            request = parse_responses_request(body, "medium", MODEL)
            unsealer = Unsealer(Sealer("turn-memory-test-key-0123"), 131072)
            made = asyncio.run(plan(renderer, unsealer, request, None, [], request.input_items, generate=False))
            turns.remember(f"resp_{number}", made, [])
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"\n32 turns of 1 MB unrendered: {held / 2**20:.1f} MiB held, {memory.used / 2**20:.1f} MiB counted")
    assert held <= CONNECTION_BYTES and memory.used <= CONNECTION_BYTES
