"""An in-process TensorRT-LLM engine's KV-cache events, read as its own trtllm-serve reads them, in vLLM's shape.

`LLM.get_kv_cache_events_async(timeout)` (tensorrt_llm/llmapi/llm.py, in every release read: the 1.0 era, late
2025 and 2026, id 55216765702) yields event dicts: `{"event_id", "window_size", "attention_dp_rank", "data":
{"type": ...}}` where `type` is `created`, `stored` (`parent_hash`, `blocks`: each `block_hash` and its `tokens`,
`{"token_id": ...}`), `removed` (`block_hashes`), `updated` or, in 2026, `all_cleared`. The LLM records them only
when its arguments ask: `kv_cache_config.event_buffer_max_size` > 0 and `enable_block_reuse` (the llm.py
docstring); otherwise, or where the release lacks the method, `kv_cache_events(...)` is None.

They are read as trtllm-serve's own reader does (2026 `serve/kv_event_fanout.py`, @48f2db0b):
- each attention data-parallel rank (`attention_dp_rank`) has its own cache and its own `event_id` sequence,
  from 0; a gap on a rank clears that rank's view;
- the initial `created` events tell the attention windows; only the largest window's `stored` and `removed`
  events follow (gpt-oss mixes sliding-window and full-attention layers: the full ones say what a prompt reuses).
A stored event's last block may be partial: its whole blocks are kept, the partial one is not a reusable prefix.
Each rank's events go out in vLLM's shape (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) to `publish`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("harmony_proxy.engine")

TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block's default (2026, id 7019226376), where the LLM says none
Publish = Callable[[int, list[dict[str, Any]]], None]  # a rank, and its events in vLLM's shape


class KvCacheEvents:
    """Reads one LLM's events; hands each rank's, as vLLM publishes them, to `publish`."""

    def __init__(self, llm: Any, publish: Publish, block_size: int = TOKENS_PER_BLOCK, timeout: float = 1.0) -> None:
        self._llm = llm
        self._publish = publish
        self._block_size = block_size
        self._timeout = timeout
        self.window: int | None = None  # the largest attention window, from the initial `created` events
        self._initial = True
        self._last_id: dict[int, int] = {}

    async def follow(self) -> None:
        """Publish the engine's events as it reports them, until cancelled (run as a task)."""
        while True:
            try:
                batches: dict[int, list[dict[str, Any]]] = {}
                async for event in self._llm.get_kv_cache_events_async(self._timeout):
                    rank, read = self.read(event)
                    batches.setdefault(rank, []).extend(read)
                for rank, events in batches.items():
                    if events:
                        self._publish(rank, events)
            except (IndexError, asyncio.QueueEmpty):  # an empty queue (kv_event_fanout.py)
                await asyncio.sleep(0.05)
            except (RuntimeError, AttributeError) as exc:  # not available (yet): as kv_event_fanout.py
                logger.debug("KV-cache events unavailable: %s", exc)
                await asyncio.sleep(1)

    def read(self, event: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """One engine event: its rank, and what it says in vLLM's shape (nothing for what tells nothing)."""
        rank = int(event.get("attention_dp_rank") or 0)
        read: list[dict[str, Any]] = []
        event_id = event.get("event_id")
        if isinstance(event_id, int) and not isinstance(event_id, bool):
            previous = self._last_id.get(rank)
            if (previous is None and event_id != 0) or (previous is not None and event_id != previous + 1):
                read.append({"type": "AllBlocksCleared"})  # missed events on this rank: forget what it held
            self._last_id[rank] = event_id
        data = event.get("data") or {}
        kind, window = data.get("type"), event.get("window_size")
        if kind == "created" and self._initial:
            if window is not None:
                self.window = max(self.window or 0, int(window))
            return rank, read
        self._initial = False
        if kind == "all_cleared":
            return rank, [{"type": "AllBlocksCleared"}]
        if window is not None and self.window is not None and int(window) != self.window:
            return rank, read  # a sliding-window layer's blocks
        published = self._as_published(data)
        return rank, read + ([published] if published is not None else [])

    def _as_published(self, data: dict[str, Any]) -> dict[str, Any] | None:
        kind = data.get("type")
        if kind == "removed" and data.get("block_hashes"):
            return {"type": "BlockRemoved", "block_hashes": list(data["block_hashes"])}
        if kind != "stored":
            return None
        size, hashes, tokens = self._block_size, [], []
        for block in data.get("blocks") or ():
            ids = [token["token_id"] for token in block.get("tokens", ())]
            if len(ids) != size:
                break  # a partial block (the last): the whole ones before it stand
            hashes.append(block["block_hash"])
            tokens += ids
        if not hashes:
            return None
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": data.get("parent_hash"),
                "token_ids": tokens, "block_size": size, "kv_cache_spec_kind": "full_attention"}


def kv_cache_events(llm: Any, publish: Publish) -> KvCacheEvents | None:
    """The LLM's KV-cache events, where its release has the API and its arguments turned the events on."""
    if not hasattr(llm, "get_kv_cache_events_async"):
        return None
    kv = getattr(llm.args, "kv_cache_config", None)
    if not getattr(kv, "event_buffer_max_size", 0) or not getattr(kv, "enable_block_reuse", False):
        return None
    return KvCacheEvents(llm, publish, int(getattr(kv, "tokens_per_block", None) or TOKENS_PER_BLOCK))
