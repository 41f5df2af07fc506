"""What each upstream replica really holds in its prefix cache, from the replica's own KV-cache events.

vLLM publishes every block it stores in, or evicts from, its prefix cache (`--kv-events-config`; how harmony-proxy
finds and follows the publisher is `kv_subscriber.py`). Each `BlockStored` event carries the token ids of the blocks
and the hash of the block before them, so the router can key blocks by their tokens, chained, exactly as it keys the
prompts it routes: a prompt's longest run of leading blocks found in a replica's view is what that replica would
reuse. `BlockRemoved` and `AllBlocksCleared` take blocks out. A gap in the batch sequence numbers, or numbers starting
again (a replica that restarted), clears the view: a missed event could be an eviction, and a cache believed empty
only costs a routing preference, never a wrong answer.

gpt-oss mixes sliding-window and full-attention layers; vLLM reports each KV-cache group's blocks, and the same
tokens have the same block hash in every group. Only the full-attention group says which prefix is reusable (the
sliding group keeps a window), so other kinds of stores are skipped, and blocks are kept per group and cache tier
(`group_idx`, `medium`, as vLLM names them): a sliding-window group's eviction of a hash is not the full-attention
group's.

The events are untrusted input, and every map is bounded: the view holds at most `max_blocks` of the engine's blocks
(a stated cap), and of the GPU cache's blocks at most what the replica can hold where it says (`capacity_tokens`,
vLLM's `num_gpu_blocks` times its block size: `kv_subscriber.py` reads it). A store that would pass either bound
clears the view, both maps at once (neither keeps what the other lost): a replica that reports more than it can
hold has lost evictions, or lies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

# The stated bound on the blocks remembered per publisher where the replica does not say what it holds: ~16M tokens
# of 16-token blocks (a large multi-GPU replica's full-attention cache), ~200 MB of maps at most.
MAX_BLOCKS = 1_000_000
_FULL_ATTENTION = "full_attention"
_GPU_TIERS = ("GPU", None)  # vLLM's `medium`: None from publishers that do not say
_MAX_TIERS = 16  # (medium, group) pairs: vLLM has a few groups per cache tier
_MAX_HASH_BYTES = 64  # vLLM's hashes are 64-bit ints or 32-byte digests


class BlockView(Protocol):
    """What the cache-aware router asks of a replica's view (routing.py)."""

    @property
    def block_size(self) -> int | None: ...

    def matched_tokens(self, keys: Sequence[int]) -> int: ...


def chained_keys(prompt: Sequence[int], block_size: int) -> list[int]:
    """One key per whole block of the prompt, each covering every block before it."""
    keys: list[int] = []
    key = 0
    for start in range(0, len(prompt) - block_size + 1, block_size):
        key = hash((key, tuple(prompt[start : start + block_size])))
        keys.append(key)
    return keys


class HeldBlocks:
    """The blocks one publisher (a replica, or one data-parallel rank of it) holds, as its events tell, keyed by their
    tokens (see `chained_keys`)."""

    def __init__(self, max_blocks: int = MAX_BLOCKS, capacity_tokens: int | None = None) -> None:
        self.block_size: int | None = None
        self.max_blocks = max_blocks
        self.capacity_tokens = capacity_tokens  # what the replica's GPU cache holds, where it says
        self._key_of: dict[tuple[Any, Any], dict[Any, int]] = {}  # (medium, group) -> engine hash -> chained key
        self._holders: dict[int, int] = {}  # chained key -> how many of the engine's blocks have those tokens
        self._blocks = 0  # entries over every (medium, group) map
        self._gpu_blocks = 0  # of them, in the GPU cache (bounded by `capacity_tokens`)
        self.last_sequence: int | None = None

    def __len__(self) -> int:
        """The engine's blocks remembered (the largest map: every other entry count is at most this)."""
        return self._blocks

    def clear(self) -> None:
        self._key_of.clear()
        self._holders.clear()
        self._blocks = self._gpu_blocks = 0

    def batch(self, sequence: int, events: list[dict[str, Any]]) -> None:
        """Apply one published batch; `sequence` is its number in the publisher's stream."""
        if self.last_sequence is not None and sequence != self.last_sequence + 1:
            self.clear()  # missed batches (or a restarted replica): what we believe may be stale
        self.last_sequence = sequence
        for event in events:
            self.apply(event)

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "AllBlocksCleared":
            self.clear()
        elif kind == "BlockStored":
            if event.get("kv_cache_spec_kind", _FULL_ATTENTION) == _FULL_ATTENTION:
                self._stored(event)
        elif kind == "BlockRemoved":
            tier, hashes = _tier(event), event.get("block_hashes")
            blocks = self._key_of.get(tier) if tier is not None else None
            if blocks is not None and isinstance(hashes, list):
                for block_hash in hashes:
                    if _is_hash(block_hash) and (key := blocks.pop(block_hash, None)) is not None:
                        self._release(key, tier[0] in _GPU_TIERS)

    def _stored(self, event: dict[str, Any]) -> None:
        size, hashes, tokens = event.get("block_size"), event.get("block_hashes"), event.get("token_ids")
        parent = event.get("parent_block_hash")
        if (not isinstance(size, int) or size <= 0 or not isinstance(hashes, list) or not isinstance(tokens, list)
                or not hashes or len(tokens) != size * len(hashes) or not all(map(_is_hash, hashes))
                or (parent is not None and not _is_hash(parent)) or len(hashes) > self.max_blocks):
            return
        if size != self.block_size:
            self.clear()
            self.block_size = size
        tier = _tier(event)
        if tier is None:
            return
        if parent is None:
            key = 0
        elif (key := self._key_of.get(tier, {}).get(parent)) is None:
            return  # its prefix was stored before we listened: its key cannot be known
        gpu = tier[0] in _GPU_TIERS
        capacity = self.capacity_tokens // size if self.capacity_tokens is not None and gpu else None
        if capacity is not None and len(hashes) > capacity:
            return
        if (self._blocks + len(hashes) > self.max_blocks
                or capacity is not None and self._gpu_blocks + len(hashes) > capacity):
            self.clear()  # more than the replica holds: evictions were lost (or the replica lies)
            if parent is not None:
                return
        if tier not in self._key_of and len(self._key_of) >= _MAX_TIERS:
            return
        blocks = self._key_of.setdefault(tier, {})
        holders = self._holders
        for index, block_hash in enumerate(hashes):
            key = hash((key, tuple(tokens[index * size : (index + 1) * size])))
            known = blocks.get(block_hash)
            if known == key:
                continue
            if known is None:
                self._blocks += 1
                self._gpu_blocks += gpu
            else:
                self._drop_holder(known)  # the same block, its tokens told anew
            blocks[block_hash] = key
            holders[key] = holders.get(key, 0) + 1

    def _release(self, key: int, gpu: bool) -> None:
        self._blocks -= 1
        self._gpu_blocks -= gpu
        self._drop_holder(key)

    def _drop_holder(self, key: int) -> None:
        left = self._holders.pop(key, 1) - 1
        if left:
            self._holders[key] = left

    def matched_tokens(self, keys: Sequence[int]) -> int:
        """How many leading tokens of a prompt, given its `chained_keys` at this block size, the replica holds."""
        if self.block_size is None:
            return 0
        low, high = 0, len(keys)  # chained keys: if block i is held, so were the ones before it
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in self._holders:
                low = middle
            else:
                high = middle - 1
        return low * self.block_size


class ReplicaBlocks:
    """What one replica holds: a `HeldBlocks` per publisher it lists in `/kv_event_sources` (vLLM: one per
    data-parallel rank, each with a cache of its own). A prompt is as held as the rank that holds most of it."""

    def __init__(self) -> None:
        self.ranks: list[HeldBlocks] = []

    def __len__(self) -> int:
        return sum(len(rank) for rank in self.ranks)

    @property
    def block_size(self) -> int | None:
        return next((rank.block_size for rank in self.ranks if rank.block_size is not None), None)

    def matched_tokens(self, keys: Sequence[int]) -> int:
        size = self.block_size
        return max((rank.matched_tokens(keys) for rank in self.ranks if rank.block_size == size), default=0)


def _tier(event: dict[str, Any]) -> tuple[Any, Any] | None:
    """The (medium, group) an event's blocks belong to; None for values no publisher sends."""
    medium, group = event.get("medium"), event.get("group_idx")
    if (medium is None or isinstance(medium, str) and len(medium) <= 32) and (group is None or type(group) is int):
        return medium, group
    return None


def _is_hash(value: Any) -> bool:
    return type(value) is int or type(value) is bytes and len(value) <= _MAX_HASH_BYTES
