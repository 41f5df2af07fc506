"""Which upstream replica serves a request: by prompt prefix (cache-aware) or in turn (round-robin).

An engine replica keeps the KV blocks of the prompts it served, so a conversation whose turn N+1 lands on the
replica that served turn N prefills only what is new. We hold the exact prompt token ids we send, so the router
remembers, per replica, the blocks of the prompts sent there (a bounded LRU, as the replica's own cache is). This
is an approximate router: it needs nothing from the engines (no KV events), at the price of not seeing evictions a
replica makes on its own; the LRU bound stands in for them.

Each replica is scored by what the request would cost it, in blocks, as NVIDIA Dynamo's KV router does: the blocks
it would have to prefill plus its load (requests in flight, and a quarter of the requests sent lately, a count that
decays by half over ~45 requests) times the mean request's blocks. A growing conversation stays where its prefix is; a new one, whose only
match is the system prompt every conversation shares, goes where the load is lowest. And one hot conversation
cannot pin a replica: besides its cost, a replica with more than `load_factor` times the mean of the requests in
flight, plus one, is passed over (bounded-load consistent hashing).

Session keys clients send (`previous_response_id`, `prompt_cache_key`, `session-id` headers) are hints: among
replicas that cost the same (prompts shorter than a block), the replica that served the session last wins.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

BLOCK_TOKENS = 64  # routing granularity; a match is counted in whole blocks
# Tokens of a block that enter its key. Routing only needs to tell conversations apart, and a wrong match costs a
# cache miss, never a wrong answer; hashing a sample makes a 100k-token prompt ~4x cheaper to route (~1 ms).
SAMPLE_STRIDE = 4
_DECAY = 0.985  # per request sent: a request counts half after ~45 more
# A request sent lately weighs a quarter of one in flight: it tells where conversations live (and will come back),
# which spreads new ones even when traffic is sequential, without outweighing a conversation's cached prefix.
_RECENT_WEIGHT = 0.25


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
        """The replica took the request (its stream opened): remember it and count it as in flight."""
        ...

    def finished(self, replica: int) -> None:
        """A request the replica took has ended."""
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

    def finished(self, replica: int) -> None:
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
                 load_factor: float = 1.25, block_tokens: int = BLOCK_TOKENS) -> None:
        self._replicas = replicas
        self._block_tokens = block_tokens
        self._cached = [_LRU(cache_blocks) for _ in range(replicas)]  # block keys sent to each replica
        self._sessions = _LRU(sessions)  # hint (session key, response id) -> the replica that served it last
        self._load_factor = load_factor
        self.in_flight = [0] * replicas
        self.recent = [0.0] * replicas  # requests sent lately, decayed per request sent
        self._blocks_sent = 0.0  # prompt blocks of the requests sent lately, decayed as `recent` is
        self._fallback = itertools.count()  # spreads ties when nothing else tells replicas apart

    def route(self, prompt: Sequence[int], hints: Sequence[str] = ()) -> Route:
        keys = block_keys(prompt, self._block_tokens)
        matched = {replica: self._matched(replica, keys) for replica in range(self._replicas)}
        hinted = next((replica for hint in hints if (replica := self._sessions.get(hint)) is not None), None)
        load = [flying + _RECENT_WEIGHT * recent for flying, recent in zip(self.in_flight, self.recent, strict=True)]
        bound = self._load_factor * (sum(self.in_flight) + 1) / self._replicas + 1
        turn = next(self._fallback)
        sent = sum(self.recent)
        mean_blocks = self._blocks_sent / sent if sent else 0.0

        def rank(replica: int) -> tuple[bool, float, bool, int]:
            cost = len(keys) - matched[replica] + load[replica] * mean_blocks
            return (self.in_flight[replica] + 1 > bound, cost, replica != hinted, (replica - turn) % self._replicas)

        return Route(sorted(range(self._replicas), key=rank), keys, tuple(hints), matched)

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

    def sent(self, route: Route, replica: int, request_id: str) -> None:
        cached = self._cached[replica]
        for key in reversed(route.keys):  # a prompt's first blocks most recent: the LRU drops its tail first
            cached.put(key)
        for hint in (*route.hints, request_id):
            self._sessions.put(hint, replica)
        self.in_flight[replica] += 1
        self.recent = [recent * _DECAY for recent in self.recent]
        self.recent[replica] += 1
        self._blocks_sent = self._blocks_sent * _DECAY + len(route.keys)

    def finished(self, replica: int) -> None:
        self.in_flight[replica] -= 1


ROUTERS = ("cache-aware", "round-robin")


def make_router(policy: str, replicas: int) -> Router:
    if policy == "cache-aware":
        return CacheAwareRouter(replicas)
    if policy == "round-robin":
        return RoundRobinRouter(replicas)
    raise ValueError(f"unknown routing policy {policy!r}; choose from {', '.join(ROUTERS)}")
