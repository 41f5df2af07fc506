"""What a replica holds, from its KV-cache events: the block view, and the router preferring what is really held.

The events here are written in vLLM's shape (`vllm/distributed/kv_events.py`: `BlockStored`, `BlockRemoved`,
`AllBlocksCleared`, tagged msgpack structs in an array-like `KVEventBatch`); tests/test_vllm_routing.py checks the
same code against real vLLM replicas.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from proxy.engines.kv_events import EventSubscriber, HeldBlocks, chained_keys, event_endpoint
from proxy.engines.routing import BLOCK_TOKENS, CacheAwareRouter

SIZE = 16


def tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200_000) for _ in range(count)]


def stored(hashes: list[int], parent: int | None, token_ids: list[int], kind: str = "full_attention",
           size: int = SIZE) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": size, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 1,
            "kv_cache_spec_kind": kind}


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 1,
            "kv_cache_spec_kind": "full_attention"}


def test_stored_blocks_chain_onto_their_parent_and_match_the_prompt_they_came_from() -> None:
    held = HeldBlocks()
    prompt = tokens(5 * SIZE + 3, 1)
    held.batch(0, [stored([11, 12], None, prompt[: 2 * SIZE])])
    held.batch(1, [stored([13, 14, 15], 12, prompt[2 * SIZE : 5 * SIZE])])
    keys = chained_keys(prompt, SIZE)
    assert held.matched_tokens(keys) == 5 * SIZE
    other = prompt[:SIZE] + tokens(4 * SIZE, 2)  # shares the first block only
    assert held.matched_tokens(chained_keys(other, SIZE)) == SIZE
    held.batch(2, [removed([13])])  # an eviction in the middle: what follows it is no longer a usable prefix
    assert held.matched_tokens(keys) == 2 * SIZE


def test_sliding_window_groups_are_not_a_reusable_prefix() -> None:
    held = HeldBlocks()
    prompt = tokens(2 * SIZE, 3)
    held.batch(0, [stored([21, 22], None, prompt, kind="sliding_window")])
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == 0


def test_a_block_whose_prefix_was_never_seen_is_not_guessed() -> None:
    held = HeldBlocks()
    prompt = tokens(3 * SIZE, 4)
    held.batch(0, [stored([32], 31, prompt[SIZE : 2 * SIZE])])  # parent 31 was stored before we listened
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == 0 and len(held) == 0


def test_a_sequence_gap_or_a_restart_forgets_everything_and_cleared_clears() -> None:
    prompt = tokens(2 * SIZE, 5)
    for events_after in ([], [{"type": "AllBlocksCleared"}]):
        held = HeldBlocks()
        held.batch(7, [stored([41, 42], None, prompt)])
        assert held.matched_tokens(chained_keys(prompt, SIZE)) == 2 * SIZE
        held.batch(8, events_after)
        assert (held.matched_tokens(chained_keys(prompt, SIZE)) == 0) == bool(events_after)
    held = HeldBlocks()
    held.batch(7, [stored([41, 42], None, prompt)])
    held.batch(9, [])  # batch 8 was missed: it may have evicted these blocks
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == 0
    held.batch(10, [stored([41, 42], None, prompt)])
    held.batch(0, [])  # the replica restarted: its cache is empty
    assert len(held) == 0


def test_the_bound_on_remembered_blocks_holds() -> None:
    held = HeldBlocks(max_blocks=10)
    for number in range(30):
        held.batch(number, [stored([1000 + number], None, tokens(SIZE, number))])
        assert len(held) <= 10


def test_malformed_events_are_skipped() -> None:
    held = HeldBlocks()
    for event in ({"type": "BlockStored"}, stored([1, 2], None, tokens(SIZE, 1)),  # two hashes, one block of tokens
                  stored([3], None, tokens(SIZE, 1), size=0), {"type": "BlockRemoved", "block_hashes": None},
                  {"type": "Unknown"}):
        held.apply(event)
    assert len(held) == 0


def test_a_published_batch_is_decoded_as_vllm_encodes_it() -> None:
    class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):  # vLLM's shape: tagged, not array-like
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        kv_cache_spec_kind: str | None = None

    class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
        ts: float
        events: list[BlockStored]

    prompt = tokens(SIZE, 6)
    payload = msgspec.msgpack.encode(Batch(1.0, [BlockStored([51], None, prompt, SIZE, "full_attention")]))
    subscriber = EventSubscriber("http://127.0.0.1:1", HeldBlocks(), client=None)  # type: ignore[arg-type]
    subscriber._apply([b"", (0).to_bytes(8, "big"), payload])
    assert subscriber.held.matched_tokens(chained_keys(prompt, SIZE)) == SIZE
    subscriber._apply([b"", (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
    assert len(subscriber.held) == 0


def test_the_publisher_endpoint_is_found_from_kv_event_sources() -> None:
    source = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    # vLLM binds a wildcard (reached at the replica's host) or an ipc path, and connects to any other address
    assert event_endpoint("http://10.1.2.3:8000", {"0": source}) == ("tcp://10.1.2.3:5557", False)
    assert event_endpoint("http://[::1]:8000", {"0": source}) == ("tcp://[::1]:5557", False)
    assert event_endpoint("http://h:8000", {"0": {**source, "endpoint": "tcp://127.0.0.1:6000"}}) == \
        ("tcp://127.0.0.1:6000", True)
    assert event_endpoint("http://h:8000", {"0": {**source, "endpoint": "ipc:///tmp/x"}}) == ("ipc:///tmp/x", False)
    assert event_endpoint("http://h:8000", {"0": {**source, "enable_kv_cache_events": False}}) is None
    assert event_endpoint("http://h:8000", {"0": {**source, "endpoint": "inproc://x"}}) is None
    assert event_endpoint("http://h:8000", {}) is None and event_endpoint("http://h:8000", []) is None


def test_the_router_prefers_the_replica_that_really_holds_the_prompt() -> None:
    """The approximate view thinks replica 0 holds the conversation (it was sent there); replica 0's events say it
    evicted it and replica 1 holds it (another front end sent it there): the events win."""
    held = [HeldBlocks(), HeldBlocks()]
    router = CacheAwareRouter(2, held=held)
    prompt = tokens(8 * BLOCK_TOKENS, 7)
    route = router.route(prompt)
    router.sent(route, 0, "resp_1")
    router.finished(route, 0)
    assert router.route(prompt + tokens(50, 8)).order[0] == 0  # no events yet: the approximate view decides
    blocks = [prompt[start : start + SIZE] for start in range(0, len(prompt), SIZE)]
    held[0].batch(0, [stored([1], None, blocks[0])])  # replica 0 keeps only the first block
    held[1].batch(0, [stored(list(range(100, 100 + len(blocks))), None, prompt)])
    assert router.route(prompt + tokens(50, 8)).order[0] == 1
