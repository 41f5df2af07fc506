"""A bounded least-recently-used map, shared by the caches of work done once per distinct content."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    entries: int
    weight: int  # in the cache's unit: bytes of JSON, tokens


class BoundedCache(Generic[K, V]):
    """Least recently used entries go first, past `max_entries` or `max_weight` in all.

    Safe to share between the event loop and worker threads (large requests are handled off the loop).
    """

    def __init__(self, max_entries: int, max_weight: int) -> None:
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._hits = self._misses = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._hits += 1
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V, weight: int) -> None:
        if weight > self.max_weight or self.max_entries <= 0:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            while self._weight > self.max_weight or len(self._entries) > self.max_entries:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped

    def discard(self, key: K) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[1]

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._entries), self._weight)
