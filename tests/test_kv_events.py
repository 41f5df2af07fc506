"""What a replica holds, from its KV-cache events: the block view, the router preferring what is really held, and the
event channel read as the untrusted input it is (bounded maps, bounded work per turn of the event loop, a budget,
never listening where a replica says).

The events here are written in vLLM's shape (`vllm/distributed/kv_events.py`: `BlockStored`, `BlockRemoved`,
`AllBlocksCleared`, tagged msgpack structs in an array-like `KVEventBatch`; tests/kv_publisher.py sends them as
vLLM's `ZmqEventPublisher` does); tests/test_vllm_routing.py checks the same code against real vLLM replicas.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio

from proxy.engines.upstream import kv_subscriber
from proxy.engines.upstream.kv_events import HeldBlocks, ReplicaBlocks, chained_keys
from proxy.engines.upstream.kv_subscriber import (
    EventBudget,
    EventSubscriber,
    Publisher,
    cache_capacity,
    find_publishers,
)
from proxy.engines.upstream.routing import BLOCK_TOKENS, CacheAwareRouter
from tests.conftest import LiveServer
from tests.kv_publisher import BlockStored, KVEventBatch, replica_app, source
from tests.vllm_server import free_port

SIZE = 16


def tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200_000) for _ in range(count)]


def stored(hashes: list[int], parent: int | None, token_ids: list[int], kind: str = "full_attention",
           size: int = SIZE, group: int = 1) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": size, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": group,
            "kv_cache_spec_kind": kind}


def removed(hashes: list[int], group: int = 1) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": group}


def map_entries(held: HeldBlocks) -> int:
    """Entries in every map and set the view keeps (one level of nesting): what its memory grows with."""
    total = 0
    for value in vars(held).values():
        if isinstance(value, dict | set):
            total += len(value)
            if isinstance(value, dict):
                total += sum(len(inner) for inner in value.values() if isinstance(inner, dict | set))
    return total


def payload(events: list[BlockStored]) -> bytes:
    return msgspec.msgpack.encode(KVEventBatch(time.time(), events))


# The block view


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


def test_a_sliding_window_groups_eviction_is_not_the_full_attention_groups() -> None:
    """vLLM hashes the same tokens alike in every KV-cache group; its `BlockRemoved` names the group (`group_idx`)
    and not the kind. gpt-oss's sliding-window group evicts blocks the full-attention group still holds."""
    held = HeldBlocks()
    prompt = tokens(2 * SIZE, 3)
    held.batch(0, [stored([21, 22], None, prompt, group=0), stored([21, 22], None, prompt, "sliding_window", group=1)])
    held.batch(1, [removed([21, 22], group=1)])
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == 2 * SIZE
    held.batch(2, [removed([22], group=0)])
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == SIZE


def test_blocks_of_the_same_tokens_stay_held_until_the_last_one_goes() -> None:
    """Two of the engine's blocks can hold the same tokens (a LoRA or a cache salt changes the hash, not the tokens):
    the prefix is held while either is."""
    held = HeldBlocks()
    prompt = tokens(SIZE, 4)
    held.batch(0, [stored([31], None, prompt), stored([32], None, prompt)])
    held.batch(1, [removed([31])])
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == SIZE
    held.batch(2, [removed([32])])
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == 0 and len(held) == 0


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


def test_blocks_stored_under_ever_new_hashes_keep_every_map_bounded() -> None:
    """Before: one block of the same tokens stored under 1 M new hashes kept one block "held" and 1 M entries in the
    hash map (+150 MB). Every map is bounded: by the stated cap, and by the replica's own cache where it says."""
    events = 50_000
    for held, bound in ((HeldBlocks(max_blocks=1000), 1000), (HeldBlocks(capacity_tokens=300 * SIZE), 300)):
        largest = 0
        for number in range(events):
            held.batch(number, [stored([10**9 + number], None, list(range(SIZE)))])
            if number % 97 == 0:
                largest = max(largest, len(held), map_entries(held))
        largest = max(largest, len(held), map_entries(held))
        assert 0 < len(held) <= bound
        assert largest <= 2 * bound, largest  # the hash map and the held set; every other map is smaller still


def test_one_store_larger_than_the_bound_is_not_kept() -> None:
    held = HeldBlocks(max_blocks=10)
    prompt = tokens(11 * SIZE, 8)
    held.batch(0, [stored(list(range(500, 511)), None, prompt)])
    assert len(held) == 0 and map_entries(held) == 0


def test_malformed_events_are_skipped() -> None:
    held = HeldBlocks()
    for event in ({"type": "BlockStored"}, stored([1, 2], None, tokens(SIZE, 1)),  # two hashes, one block of tokens
                  stored([3], None, tokens(SIZE, 1), size=0), {"type": "BlockRemoved", "block_hashes": None},
                  stored([[4]], None, tokens(SIZE, 1)), stored([5], None, tokens(SIZE, 1)) | {"group_idx": "x"},
                  stored([b"x" * 1000], None, tokens(SIZE, 1)), {"type": "Unknown"}):
        held.apply(event)
    assert len(held) == 0


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


# Reading a publisher


def subscriber(budget: EventBudget | None = None) -> tuple[EventSubscriber, HeldBlocks]:
    view = ReplicaBlocks()
    view.ranks = [HeldBlocks()]
    return EventSubscriber("http://127.0.0.1:1", view, client=None, budget=budget), view.ranks[0]  # type: ignore


def test_a_published_batch_is_decoded_as_vllm_encodes_it() -> None:
    prompt = tokens(SIZE, 6)
    follower, held = subscriber()
    frames = [b"", (0).to_bytes(8, "big"), payload([BlockStored([51], None, prompt, SIZE, group_idx=0,
                                                                kv_cache_spec_kind="full_attention")])]
    asyncio.run(follower.take(frames, held))
    assert held.matched_tokens(chained_keys(prompt, SIZE)) == SIZE
    for wrong in (b"\xc1 not msgpack", msgspec.msgpack.encode(["not a time", []]), b"\x91" * 100_000):
        asyncio.run(follower.take([b"", (1).to_bytes(8, "big"), wrong], held))
        assert len(held) == 0
    assert follower.counts.malformed_batches == 3 and follower.counts.applied_batches == 1


def test_a_large_batch_is_applied_a_slice_at_a_time() -> None:
    """Before, a batch was decoded and applied in one go: one 3 MiB batch held the event loop 2.9-4.6 s. Now the
    loop turns between slices of a few hundred events: counted by a task that only counts its turns."""
    events = 20_000
    follower, held = subscriber(EventBudget(bytes_per_second=1e9, burst_bytes=1e9))
    frames = [b"", (0).to_bytes(8, "big"),
              payload([BlockStored([10**6 + number], None, tokens(SIZE, number % 50), SIZE) for number in
                       range(events)])]

    async def run() -> int:
        turns = 0
        done = False

        async def count() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count())
        await asyncio.sleep(0)
        await follower.take(frames, held)
        done = True
        await counter
        return turns

    turns = asyncio.run(run())
    assert len(held) == events
    assert turns >= events // kv_subscriber._SLICE_EVENTS, turns


def test_past_its_budget_a_replicas_batches_are_dropped_counted_and_its_view_cleared(
        caplog: pytest.LogCaptureFixture) -> None:
    prompt = tokens(SIZE, 9)
    batch = payload([BlockStored([61], None, prompt, SIZE)])
    size = len(batch) + 8  # the three frames: topic, sequence, payload
    follower, held = subscriber(EventBudget(bytes_per_second=1.0, burst_bytes=2 * size))
    bucket = follower._bucket

    async def send(count: int, first: int) -> None:
        for number in range(first, first + count):
            await follower.take([b"", number.to_bytes(8, "big"), batch], held)

    with caplog.at_level(logging.WARNING, "harmony_proxy.engine"):
        asyncio.run(send(2, 0))
        assert held.matched_tokens(chained_keys(prompt, SIZE)) == SIZE
        asyncio.run(send(5, 2))
    assert len(held) == 0  # what the dropped batches said (evictions, say) is unknown: nothing is believed
    assert (follower.counts.applied_batches, follower.counts.dropped_batches) == (2, 5)
    bucket._level = bucket._burst  # within the budget again
    asyncio.run(send(1, 8))  # batch 7 never came (the dropped ones did)
    assert follower.counts.missed_batches == 1
    assert follower.counts.dropped_bytes == 5 * size
    assert sum("budget" in record.getMessage() for record in caplog.records) == 1  # logged once


def test_publishers_are_found_for_every_rank_and_only_connected_to() -> None:
    """vLLM binds a wildcard or an ipc path (reached at the replica), and connects to any other address: harmony-proxy
    listens there only where `--upstream-kv-events-bind` names that very address."""
    source = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    assert find_publishers("http://10.1.2.3:8000", {"0": source, "1": {**source, "endpoint": "tcp://*:5558"}}) == (
        [Publisher("0", "tcp://10.1.2.3:5557", False), Publisher("1", "tcp://10.1.2.3:5558", False)], [])
    assert find_publishers("http://[::1]:8000", {"0": source})[0] == [Publisher("0", "tcp://[::1]:5557", False)]
    for address in ("tcp://0.0.0.0:6000", "tcp://127.0.0.1:6000", "tcp://10.9.9.9:6000"):
        found, refused = find_publishers("http://h:8000", {"0": {**source, "endpoint": address}})
        assert found == [] and "--upstream-kv-events-bind" in refused[0]
    # vLLM publishes `tcp://*:0` as the address it bound, on the replica's host: connected to.
    assert find_publishers("http://10.1.2.3:8000", {"0": {**source, "endpoint": "tcp://10.1.2.3:40000"}})[0] == [
        Publisher("0", "tcp://10.1.2.3:40000", False)]
    allowed = find_publishers("http://h:8000", {"0": {**source, "endpoint": "tcp://127.0.0.1:6000"}},
                              bindable=["tcp://127.0.0.1:6000"])
    assert allowed == ([Publisher("0", "tcp://127.0.0.1:6000", True)], [])
    assert find_publishers("http://127.0.0.1:8000", {"0": {**source, "endpoint": "ipc:///tmp/x"}})[0] == [
        Publisher("0", "ipc:///tmp/x", False)]
    assert find_publishers("http://10.1.2.3:8000", {"0": {**source, "endpoint": "ipc:///tmp/x"}})[0] == []
    assert find_publishers("http://h:8000", {"0": {**source, "enable_kv_cache_events": False}}) == ([], [])
    assert find_publishers("http://h:8000", {"0": {**source, "endpoint": "inproc://x"}})[0] == []
    assert find_publishers("http://h:8000", {}) == ([], []) and find_publishers("http://h:8000", []) == ([], [])
    many = {str(rank): source for rank in range(1000)}
    assert len(find_publishers("http://h:8000", many)[0]) == kv_subscriber.MAX_RANKS


def test_the_cache_size_is_read_from_vllms_metrics() -> None:
    text = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="300"} 1.0\n'
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="None"} 1.0\n'
            'vllm:num_requests_running{engine="0"} 0.0\n')
    assert cache_capacity(text) == {"0": 300 * 16}


# A replica's publishers, on loopback


class Following(EventSubscriber):
    """An EventSubscriber a test can ask whether it still follows."""

    def running(self) -> bool:
        """Whether its task runs (a task that ended by an error is shown)."""
        if self._task is not None and self._task.done() and not self._task.cancelled() and self._task.exception():
            raise AssertionError("the follower failed") from self._task.exception()
        return self._task is None or not self._task.done()


async def follow(url: str, until: Callable[[Following], bool], bindable: tuple[str, ...] = (),
                 action: Callable[[], Any] | None = None,
                 still: Callable[[Following], bool] = lambda follower: follower.running()) -> Following:
    """An EventSubscriber following the replica at `url` until `until` holds (asked every 50 ms), as long as it
    takes while `still` holds (by default, while the follower runs; pytest-timeout catches a hang); `action` is
    repeated meanwhile (publishing, say: ZMQ delivers only what is sent after a subscription joins)."""
    async with httpx.AsyncClient() as client:
        follower = Following(url, ReplicaBlocks(), client, bindable=bindable)
        follower.start()
        try:
            while not until(follower):
                assert still(follower), "the follower stopped, or believed what it must not, before the condition held"
                if action is not None:
                    action()
                await asyncio.sleep(0.05)
        finally:
            await follower.close()
        return follower



def listening(host: str, port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


@pytest.fixture
def publishers() -> Iterator[list[tuple[zmq.Socket, int]]]:
    context = zmq.Context.instance()
    sockets = [context.socket(zmq.PUB) for _ in range(2)]
    yield [(pub, pub.bind_to_random_port("tcp://127.0.0.1")) for pub in sockets]
    for pub in sockets:
        pub.close(linger=0)


def test_every_publisher_a_replica_lists_is_followed(serve_app: Callable[[Any], LiveServer],
                                                     publishers: list[tuple[zmq.Socket, int]]) -> None:
    """A replica with two data-parallel ranks lists two publishers; before, only rank "0" was read. Rank 1 holds
    the prompt: the replica does. Each rank's view is bounded by its own cache, as the replica's /metrics says."""
    (_, port0), (rank1, port1) = publishers
    metrics = ('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="300"} 1.0\n'
               'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="200"} 1.0\n')
    replica = serve_app(replica_app({"0": source(f"tcp://*:{port0}"), "1": source(f"tcp://*:{port1}")}, metrics))
    prompt = tokens(4 * SIZE, 10)
    sent = iter(range(10**6))

    def publish() -> None:
        rank1.send_multipart([b"", next(sent).to_bytes(8, "big"),
                              payload([BlockStored([71, 72, 73, 74], None, prompt, SIZE)])])

    follower = asyncio.run(follow(replica.base_url, lambda f: f.view.matched_tokens(chained_keys(prompt, SIZE)) > 0,
                                  action=publish))
    assert [publisher.address for publisher in follower.publishers or ()] == [
        f"tcp://127.0.0.1:{port0}", f"tcp://127.0.0.1:{port1}"]
    assert [rank.capacity_tokens for rank in follower.view.ranks] == [300 * 16, 200 * 16]
    assert follower.view.matched_tokens(chained_keys(prompt, SIZE)) == 4 * SIZE
    assert len(follower.view.ranks[0]) == 0
    router = CacheAwareRouter(2, held=[ReplicaBlocks(), follower.view])
    assert router.route(prompt + tokens(BLOCK_TOKENS, 11)).order[0] == 1


def test_a_replica_cannot_make_harmony_proxy_listen_where_it_says(serve_app: Callable[[Any], LiveServer]) -> None:
    """Before: a replica naming tcp://0.0.0.0:P had harmony-proxy bind P on every interface, and anyone reaching it
    could forge that replica's events (10 of 10 conversations moved to it). Here the address is another loopback
    one than the replica's (the tests listen on no other interface): harmony-proxy does not listen there, and what
    is sent there is not believed."""
    port = free_port()
    address = f"tcp://127.0.0.2:{port}"
    replica = serve_app(replica_app({"0": source(address)}))
    forger = zmq.Context.instance().socket(zmq.PUB)
    forger.connect(address)
    prompt = tokens(2 * SIZE, 12)
    sent = iter(range(10**6))

    def forge() -> None:
        forger.send_multipart([b"", next(sent).to_bytes(8, "big"),
                               payload([BlockStored([81, 82], None, prompt, SIZE)])])

    try:
        # As long as it believes nothing forged: a follower that listened there would read the forger's blocks.
        follower = asyncio.run(follow(replica.base_url, lambda f: not f.running(), action=forge,
                                      still=lambda f: len(f.view) == 0))
        assert follower.publishers is None and len(follower.view) == 0
        assert not listening("127.0.0.2", port)
        # Allowed by name (--upstream-kv-events-bind), that one address is listened on, and what arrives is read.
        follower = asyncio.run(follow(replica.base_url, lambda f: len(f.view) > 0, (address,), action=forge))
        assert follower.publishers == [Publisher("0", address, True)]
    finally:
        forger.close(linger=0)


def test_a_message_past_the_size_bound_ends_the_connection_and_it_is_opened_again(
        serve_app: Callable[[Any], LiveServer], publishers: list[tuple[zmq.Socket, int]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ZMQ refuses a message over MAXMSGSIZE before it is in memory, and drops the connection without opening it
    again: the subscriber notices, forgets what it believed, and connects anew."""
    monkeypatch.setattr(kv_subscriber, "MAX_MESSAGE_BYTES", 10_000)
    monkeypatch.setattr(kv_subscriber, "_REOPEN_SECONDS", 0.1)
    (pub, port), _ = publishers
    replica = serve_app(replica_app({"0": source(f"tcp://*:{port}")}))
    prompt = tokens(SIZE, 13)
    sent = iter(range(10**6))
    stage = {"oversized": False}

    def publish() -> None:
        events = [BlockStored([91], None, prompt, SIZE)]
        if stage["oversized"]:
            events.append(BlockStored([92], 91, list(range(20_000)), 20_000))
        pub.send_multipart([b"", next(sent).to_bytes(8, "big"), payload(events)])

    async def run() -> EventSubscriber:
        async with httpx.AsyncClient() as client:
            follower = Following(replica.base_url, ReplicaBlocks(), client)
            follower.start()
            try:
                for condition, oversized in ((lambda: len(follower.view) == 1, False),
                                             (lambda: follower.counts.disconnects == 1, True),
                                             (lambda: len(follower.view) == 1, False)):
                    stage["oversized"] = oversized
                    while not condition():  # as long as it runs (pytest-timeout catches a hang)
                        assert follower.running(), "the follower stopped"
                        publish()
                        await asyncio.sleep(0.05)
            finally:
                await follower.close()
            return follower

    follower = asyncio.run(run())
    assert follower.counts.disconnects == 1 and follower.counts.applied_batches >= 2
