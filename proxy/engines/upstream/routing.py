"""Which upstream replica serves a request: by prompt prefix (cache-aware) or in turn (round-robin).

An engine replica keeps the KV blocks of the prompts it served, so a conversation whose turn N+1 lands on the
replica that served turn N prefills only what is new. We hold the exact prompt token ids we send, so the router
remembers, per replica, the blocks of the prompts sent there (a bounded LRU, as the replica's own cache is). This
approximate view needs nothing from the engines, at the price of not seeing evictions a replica makes on its own
(the LRU bound stands in for them). Where a replica publishes its KV-cache events (vLLM's `--kv-events-config`),
its view is exact instead: `proxy/engines/upstream/kv_events.py` keeps the blocks it really holds, and what it holds
of a prompt is looked up there.

A prompt's prefix has two parts. What many conversations share (the system prompt, the tools) is found where
several continuations followed the same block; the router learns those branch points from the prompts it sends.
Past it, the prompt is its conversation's own: the replica that holds the most of that part is the conversation's
home, and the request goes there. A new conversation (no part of its own cached anywhere) goes where the load is
lowest: the requests in flight, plus a quarter of the requests sent lately (decaying by half over ~45 requests),
so that new conversations spread even when traffic is sequential, rather than all following the replica that saw
the shared system prompt first. And one hot conversation cannot pin a replica: one with more than `load_factor`
times the mean of the requests in flight, plus two, is passed over (bounded-load consistent hashing).

Session keys clients send (`previous_response_id`, `prompt_cache_key`, `session-id` headers) are hints: among
replicas that hold equally much of the conversation (prompts shorter than a block, say), the replica that served
the session last wins.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.engines.upstream.kv_events import BlockView, chained_keys

BLOCK_TOKENS = 64  # routing granularity; a match is counted in whole blocks
# Tokens of a block that enter its key. Routing only needs to tell conversations apart, and a wrong match costs a
# cache miss, never a wrong answer; hashing a sample makes a 100k-token prompt ~4x cheaper to route (~1 ms).
SAMPLE_STRIDE = 4
_DECAY = 0.985  # per request sent: a request counts half after ~45 more
# A request sent lately weighs a quarter of one in flight: it tells where conversations live (and will come back).
_RECENT_WEIGHT = 0.25
# Requests in flight a replica may have beyond `load_factor` times the mean before its conversations go elsewhere:
# an engine batches many, so a light load is no reason to give up a conversation's cache.
_SLACK = 2


def block_keys(prompt: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """One key per whole block of the prompt; each key covers every block before it (a chain), so equal keys
    mean equal prefixes."""
    keys: list[int] = []
    key = 0
    for start in range(0, len(prompt) - block_tokens + 1, block_tokens):
        key = hash((key, tuple(prompt[start : start + block_tokens : SAMPLE_STRIDE])))
        keys.append(key)
    return keys


@dataclass
class Route:
    """A routing decision: the replicas to try, best first, and what to remember about the one that takes it."""

    order: list[int]
    keys: list[int] = field(default_factory=list)
    hints: tuple[str, ...] = ()
    matched_blocks: dict[int, int] = field(default_factory=dict)


class Router(Protocol):
    name: str

    def route(self, prompt: Sequence[int], hints: Sequence[str] = ()) -> Route:
        """The replicas to try for this prompt, best first."""
        ...

    def sent(self, route: Route, replica: int, request_id: str) -> None:
        """The request is being sent to the replica: remember it and count it as in flight."""
        ...

    def finished(self, route: Route, replica: int) -> None:
        """A request sent to the replica has ended (or the replica refused it)."""
        ...


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self, replicas: int) -> None:
        self._replicas = replicas
        self._turns = itertools.cycle(range(replicas))

    def route(self, prompt: Sequence[int], hints: Sequence[str] = ()) -> Route:
        first = next(self._turns)
        return Route([(first + offset) % self._replicas for offset in range(self._replicas)])

    def sent(self, route: Route, replica: int, request_id: str) -> None:
        pass

    def finished(self, route: Route, replica: int) -> None:
        pass


class _LRU:
    """Keys in least-recently-used order, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[object, int] = OrderedDict()

    def get(self, key: object) -> int | None:
        return self._keys.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def put(self, key: object, value: int = 0) -> None:
        self._keys[key] = value
        self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)


class CacheAwareRouter:
    name = "cache-aware"

    def __init__(self, replicas: int, cache_blocks: int = 200_000, sessions: int = 50_000,
                 load_factor: float = 1.5, block_tokens: int = BLOCK_TOKENS,
                 held: Sequence[BlockView | None] = ()) -> None:
        self._replicas = replicas
        self._held = list(held) or [None] * replicas  # a replica's blocks as its own events tell, where it sends them
        self._block_tokens = block_tokens
        self._cached = [_LRU(cache_blocks) for _ in range(replicas)]  # block keys sent to each replica
        self._next = _LRU(cache_blocks)  # block key -> the key of the block that followed it
        self._shared = _LRU(cache_blocks)  # block keys that more than one continuation followed
        self._sessions = _LRU(sessions)  # hint (session key, response id) -> the replica that served it last
        self._load_factor = load_factor
        self.in_flight = [0] * replicas
        self.recent = [0.0] * replicas  # requests sent lately, decayed per request
        self._fallback = itertools.count()  # spreads ties when nothing else tells replicas apart

    def route(self, prompt: Sequence[int], hints: Sequence[str] = ()) -> Route:
        keys = block_keys(prompt, self._block_tokens)
        exact = self._held_blocks(prompt)
        matched = {replica: exact[replica] if replica in exact else self._matched(replica, keys)
                   for replica in range(self._replicas)}
        shared = self._shared_blocks(keys)
        hinted = next((replica for hint in hints if (replica := self._sessions.get(hint)) is not None), None)
        bound = self._load_factor * (sum(self.in_flight) + 1) / self._replicas + _SLACK
        turn = next(self._fallback)

        def rank(replica: int) -> tuple[bool, int, bool, float, int]:
            load = self.in_flight[replica] + _RECENT_WEIGHT * self.recent[replica]
            return (self.in_flight[replica] + 1 > bound, -max(0, matched[replica] - shared), replica != hinted, load,
                    (replica - turn) % self._replicas)

        return Route(sorted(range(self._replicas), key=rank), keys, tuple(hints), matched)

    def _held_blocks(self, prompt: Sequence[int]) -> dict[int, int]:
        """How many leading blocks of the prompt each replica that publishes its events really holds."""
        found: dict[int, int] = {}
        keys_by_size: dict[int, list[int]] = {}
        for replica, held in enumerate(self._held):
            if held is None or held.block_size is None:
                continue
            if held.block_size not in keys_by_size:
                keys_by_size[held.block_size] = chained_keys(prompt, held.block_size)
            found[replica] = held.matched_tokens(keys_by_size[held.block_size]) // self._block_tokens
        return found

    def _matched(self, replica: int, keys: list[int]) -> int:
        """How many leading blocks of the prompt went to the replica (keys are chained: a binary search)."""
        cached = self._cached[replica]
        low, high = 0, len(keys)
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in cached:
                low = middle
            else:
                high = middle - 1
        return low

    def _shared_blocks(self, keys: list[int]) -> int:
        """How many leading blocks of the prompt other conversations share: up to its last block that several
        continuations followed, or up to where it leaves a prefix sent before."""
        shared = 0
        for index, key in enumerate(keys):
            following = self._next.get(key)
            if following is None:
                break
            if key in self._shared or (index + 1 < len(keys) and following != keys[index + 1]):
                shared = index + 1
        return shared

    def sent(self, route: Route, replica: int, request_id: str) -> None:
        cached = self._cached[replica]
        for key in reversed(route.keys):  # a prompt's first blocks most recent: the LRU drops its tail first
            cached.put(key)
        for key, following in zip(route.keys, route.keys[1:]):
            known = self._next.get(key)
            if known is not None and known != following:
                self._shared.put(key)
            self._next.put(key, following)
        for hint in (*route.hints, request_id):
            self._sessions.put(hint, replica)
        self.in_flight[replica] += 1
        self.recent = [recent * _DECAY for recent in self.recent]
        self.recent[replica] += 1

    def finished(self, route: Route, replica: int) -> None:
        self.in_flight[replica] -= 1


ROUTERS = ("cache-aware", "round-robin")


def make_router(policy: str, replicas: int, held: Sequence[BlockView | None] = ()) -> Router:
    if policy == "cache-aware":
        return CacheAwareRouter(replicas, held=held)
    if policy == "round-robin":
        return RoundRobinRouter(replicas)
    raise ValueError(f"unknown routing policy {policy!r}; choose from {', '.join(ROUTERS)}")
