"""What an engine's KV cache really holds, from TensorRT-LLM's KV-cache events, for a router to follow.

`LLM.get_kv_cache_events_async(timeout)` (tensorrt_llm/llmapi/llm.py, in every release read: the 1.0 era, late
2025 and 2026) yields event dicts: `{"event_id", "window_size", "data": {"type": ...}}` where `type` is `created`,
`stored` (`parent_hash`, `blocks`: each `block_hash` and its `tokens`, `{"token_id": ...}`), `removed`
(`block_hashes`), `updated` or, in 2026, `all_cleared`. The LLM records them only when its arguments ask:
`kv_cache_config.event_buffer_max_size` > 0 and `enable_block_reuse` (the llm.py docstring); otherwise, or where
the release lacks the method, `kv_cache_events(llm)` is None.

Events name blocks by hash; a router matches prompts by tokens. So each stored block's whole prefix is kept (its
parent's prefix plus its own tokens) until the block is removed: bounded by what the engine's cache holds. gpt-oss
mixes sliding-window and full-attention layers: only the largest window's events tell what a prompt can reuse
(as trtllm-serve's own `serve/kv_event_fanout.py` does in 2026).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class CacheChange:
    """The engine stored or removed the block that ends `prefix` (its tokens from `start` on), or cleared all."""

    kind: Literal["stored", "removed", "cleared"]
    prefix: tuple[int, ...] = ()
    start: int = 0


class CacheFollower(Protocol):
    """A router that is told what a replica's engine holds (proxy/engines/routing.py, CacheAwareRouter)."""

    def held(self, replica: int, change: CacheChange) -> None: ...


class KvCacheEvents:
    def __init__(self, llm: Any, timeout: float = 2.0) -> None:
        self._llm = llm
        self._timeout = timeout
        self._prefixes: dict[int, tuple[tuple[int, ...], int]] = {}  # block hash -> (tokens up to its end, start)
        self._window = 0

    async def changes(self) -> AsyncIterator[CacheChange]:
        """The cache's changes, as the engine reports them, until the LLM shuts down."""
        while True:
            async for event in self._llm.get_kv_cache_events_async(self._timeout):
                for change in self.read(event):
                    yield change

    def read(self, event: dict[str, Any]) -> list[CacheChange]:
        window = int(event.get("window_size") or 0)
        if window < self._window:
            return []  # a sliding-window layer's blocks
        self._window = window
        data = event.get("data") or {}
        kind = data.get("type")
        if kind == "all_cleared":
            self._prefixes.clear()
            return [CacheChange("cleared")]
        if kind == "stored":
            changes = []
            prefix = self._prefixes.get(data.get("parent_hash"), ((), 0))[0]
            for block in data.get("blocks", ()):
                start = len(prefix)
                prefix = prefix + tuple(token["token_id"] for token in block.get("tokens", ()))
                self._prefixes[block["block_hash"]] = (prefix, start)
                changes.append(CacheChange("stored", prefix, start))
            return changes
        if kind == "removed":
            removed = [self._prefixes.pop(key, None) for key in data.get("block_hashes", ())]
            return [CacheChange("removed", *held) for held in removed if held]
        return []


async def follow(events: KvCacheEvents, router: CacheFollower, replica: int) -> None:
    """Tell `router` what replica `replica` holds, as its engine reports it (run as a task)."""
    async for change in events.changes():
        router.held(replica, change)


def kv_cache_events(llm: Any) -> KvCacheEvents | None:
    """The LLM's KV-cache events, where its release has the API and its arguments turned the events on."""
    if not hasattr(llm, "get_kv_cache_events_async"):
        return None
    kv = getattr(llm.args, "kv_cache_config", None)
    if not getattr(kv, "event_buffer_max_size", 0) or not getattr(kv, "enable_block_reuse", False):
        return None
    return KvCacheEvents(llm)
