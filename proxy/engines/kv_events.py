"""What each upstream replica really holds in its prefix cache, from the replica's own KV-cache events.

vLLM publishes every block it stores in, or evicts from, its prefix cache (`--kv-events-config`, a ZMQ PUB socket;
`GET /kv_event_sources` says where). Each `BlockStored` event carries the token ids of the blocks and the hash of the
block before them, so the router can key blocks by their tokens, chained, exactly as it keys the prompts it routes:
a prompt's longest run of leading blocks found in a replica's set is what that replica would reuse. `BlockRemoved`
and `AllBlocksCleared` take blocks out. A gap in the batch sequence numbers, or numbers starting again (a replica that
restarted), clears the replica's set: a missed event could be an eviction, and a cache believed empty only costs a
routing preference, never a wrong answer.

gpt-oss mixes sliding-window and full-attention layers; vLLM reports each KV-cache group's blocks. Only the
full-attention group says which prefix is reusable (the sliding group keeps a window), so events of other kinds
are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec
import zmq
import zmq.asyncio

logger = logging.getLogger("harmony_proxy.engine")

# A bound on the blocks remembered per replica, in case events of evictions are lost without a sequence gap; the
# set is cleared when it is passed (the replica's cache is then re-learned from its next events).
MAX_BLOCKS = 2_000_000
_FULL_ATTENTION = "full_attention"
_RETRY_SECONDS = 5.0


def chained_keys(prompt: Sequence[int], block_size: int) -> list[int]:
    """One key per whole block of the prompt, each covering every block before it."""
    keys: list[int] = []
    key = 0
    for start in range(0, len(prompt) - block_size + 1, block_size):
        key = hash((key, tuple(prompt[start : start + block_size])))
        keys.append(key)
    return keys


class HeldBlocks:
    """The blocks one replica holds, as its events tell, keyed by their tokens (see `chained_keys`)."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.block_size: int | None = None
        self._max_blocks = max_blocks
        self._key_of: dict[int, int] = {}  # the engine's block hash -> our chained key
        self._held: set[int] = set()
        self._last_sequence: int | None = None

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        self._key_of.clear()
        self._held.clear()

    def batch(self, sequence: int, events: list[dict[str, Any]]) -> None:
        """Apply one published batch; `sequence` is its number in the publisher's stream."""
        if self._last_sequence is not None and sequence != self._last_sequence + 1:
            self.clear()  # missed batches (or a restarted replica): what we believe may be stale
        self._last_sequence = sequence
        for event in events:
            self.apply(event)

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "AllBlocksCleared":
            self.clear()
        elif event.get("kv_cache_spec_kind", _FULL_ATTENTION) != _FULL_ATTENTION:
            return
        elif kind == "BlockStored":
            self._stored(event)
        elif kind == "BlockRemoved":
            for block_hash in event.get("block_hashes") or ():
                key = self._key_of.pop(block_hash, None)
                if key is not None:
                    self._held.discard(key)

    def _stored(self, event: dict[str, Any]) -> None:
        size = event.get("block_size")
        hashes, tokens, parent = event.get("block_hashes") or [], event.get("token_ids") or [], event.get(
            "parent_block_hash")
        if not isinstance(size, int) or size <= 0 or len(tokens) != size * len(hashes):
            return
        if size != self.block_size:
            self.clear()
            self.block_size = size
        if parent is None:
            key = 0
        elif (key := self._key_of.get(parent)) is None:
            return  # its prefix was stored before we listened: its key cannot be known
        if len(self._held) + len(hashes) > self._max_blocks:
            self.clear()
            if parent is not None:
                return
        for index, block_hash in enumerate(hashes):
            key = hash((key, tuple(tokens[index * size : (index + 1) * size])))
            self._key_of[block_hash] = key
            self._held.add(key)

    def matched_tokens(self, keys: Sequence[int]) -> int:
        """How many leading tokens of a prompt, given its `chained_keys` at this block size, the replica holds."""
        if self.block_size is None:
            return 0
        low, high = 0, len(keys)  # chained keys: if block i is held, so were the ones before it
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in self._held:
                low = middle
            else:
                high = middle - 1
        return low * self.block_size


def event_endpoint(replica_url: str, sources: Any) -> tuple[str, bool] | None:
    """Where to listen for a replica's events, from its `/kv_event_sources` answer (rank 0: a `/v1/completions`
    server is one rank to us), and whether to bind there. vLLM's publisher binds a wildcard (`tcp://*:PORT`, reached
    at the replica's own host) or an ipc path, and connects to any other address, which the listener then binds."""
    source = sources.get("0") if isinstance(sources, dict) else None
    if not isinstance(source, dict) or not source.get("enable_kv_cache_events") or source.get("publisher") != "zmq":
        return None
    endpoint = source.get("endpoint")
    if not isinstance(endpoint, str):
        return None
    if endpoint.startswith("ipc://"):
        return endpoint, False
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if "*" in host or "::" in host:
        host = urlsplit(replica_url).hostname or "127.0.0.1"
        return (f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"), False
    return endpoint, True


class EventSubscriber:
    """Keeps one replica's `HeldBlocks` current: finds its publisher, subscribes, applies every batch."""

    _decoder = msgspec.msgpack.Decoder()

    def __init__(self, replica_url: str, held: HeldBlocks, client: httpx.AsyncClient) -> None:
        self._url = replica_url
        self.held = held
        self._client = client
        self.endpoint: tuple[str, bool] | None = None  # the address, and whether we bind it
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-events {self._url}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while self.endpoint is None:
            found = await self._discover()
            if found is False:
                logger.info("%s publishes no KV-cache events: routing to it on what was sent there", self._url)
                return
            self.endpoint = found if isinstance(found, tuple) else None
            if self.endpoint is None:
                await asyncio.sleep(_RETRY_SECONDS)
        address, bind = self.endpoint
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.bind(address) if bind else socket.connect(address)
        except zmq.ZMQError as exc:
            logger.warning("cannot listen for the KV-cache events of %s at %s (%s): routing to it on what was sent "
                           "there", self._url, address, exc)
            socket.close()
            return
        logger.info("routing on the KV-cache events of %s (%s)", self._url, address)
        try:
            while True:
                frames = await socket.recv_multipart()
                self._apply(frames)
        finally:
            socket.close()

    def _apply(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            return
        try:
            batch = self._decoder.decode(frames[2])
            sequence = int.from_bytes(frames[1], "big", signed=True)
            self.held.batch(sequence, [event for event in batch[1] if isinstance(event, dict)])
        except Exception:  # noqa: BLE001 - a malformed batch is skipped; routing falls back on what it knows
            logger.warning("a KV-event batch from %s could not be read", self._url)
            self.held.clear()

    async def _discover(self) -> tuple[str, bool] | bool:
        """Where to listen; False when the replica says it publishes nothing; True to ask again later."""
        try:
            response = await self._client.get(f"{self._url}/kv_event_sources", timeout=5.0)
            if response.status_code == 404:
                return False
            if response.status_code != 200:
                return True
            return event_endpoint(self._url, response.json()) or False
        except (httpx.HTTPError, ValueError):
            return True
