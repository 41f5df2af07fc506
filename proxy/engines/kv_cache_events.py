"""What an in-process TensorRT-LLM engine's KV cache holds, from its own KV-cache events, for a router to follow.

`LLM.get_kv_cache_events_async(timeout)` (tensorrt_llm/llmapi/llm.py, in every release read: the 1.0 era, late
2025 and 2026) yields event dicts: `{"event_id", "window_size", "data": {"type": ...}}` where `type` is `created`,
`stored` (`parent_hash`, `blocks`: each `block_hash` and its `tokens`, `{"token_id": ...}`), `removed`
(`block_hashes`), `updated` or, in 2026, `all_cleared`. The LLM records them only when its arguments ask:
`kv_cache_config.event_buffer_max_size` > 0 and `enable_block_reuse` (the llm.py docstring); otherwise, or where
the release lacks the method, `kv_cache_events(llm)` is None.

Each event is read into the shape vLLM publishes (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) and applied
to a `HeldBlocks` (proxy/engines/kv_events.py), the one view of a replica's cache that the cache-aware router looks
prompts up in, whichever engine reports it. gpt-oss mixes sliding-window and full-attention layers: only the
largest window's events tell what a prompt can reuse (as trtllm-serve's own `serve/kv_event_fanout.py` does in
2026), and an `event_id` that goes back (a restarted engine) or skips starts the view afresh.
"""

from __future__ import annotations

from typing import Any

from proxy.engines.kv_events import HeldBlocks


class KvCacheEvents:
    """Reads one engine's events into a `HeldBlocks`."""

    def __init__(self, llm: Any, held: HeldBlocks | None = None, timeout: float = 2.0) -> None:
        self._llm = llm
        self.held = held if held is not None else HeldBlocks()
        self._timeout = timeout
        self._window = 0

    async def follow(self) -> None:
        """Apply the engine's events as it reports them, until the LLM shuts down (run as a task)."""
        while True:
            async for event in self._llm.get_kv_cache_events_async(self._timeout):
                self.apply(event)

    def apply(self, event: dict[str, Any]) -> None:
        window = int(event.get("window_size") or 0)
        read = None
        if window >= self._window:  # else a sliding-window layer's blocks
            self._window = window
            read = _as_published(event.get("data") or {})
        if isinstance(event.get("event_id"), int):  # every event counts in the sequence, read or not
            self.held.batch(event["event_id"], [read] if read is not None else [])


def _as_published(data: dict[str, Any]) -> dict[str, Any] | None:
    """A TensorRT-LLM event in the shape vLLM publishes, which `HeldBlocks` reads; None for what tells nothing."""
    kind = data.get("type")
    if kind == "all_cleared":
        return {"type": "AllBlocksCleared"}
    if kind == "removed":
        return {"type": "BlockRemoved", "block_hashes": list(data.get("block_hashes") or ())}
    if kind != "stored" or not data.get("blocks"):
        return None
    blocks = data["blocks"]
    tokens = [[token["token_id"] for token in block.get("tokens", ())] for block in blocks]
    size = len(tokens[0])
    if any(len(block) != size for block in tokens):
        return None  # a partial block: not a reusable prefix
    return {"type": "BlockStored", "block_hashes": [block["block_hash"] for block in blocks],
            "parent_block_hash": data.get("parent_hash"), "token_ids": [t for block in tokens for t in block],
            "block_size": size}


def kv_cache_events(llm: Any) -> KvCacheEvents | None:
    """The LLM's KV-cache events, where its release has the API and its arguments turned the events on."""
    if not hasattr(llm, "get_kv_cache_events_async"):
        return None
    kv = getattr(llm.args, "kv_cache_config", None)
    if not getattr(kv, "event_buffer_max_size", 0) or not getattr(kv, "enable_block_reuse", False):
        return None
    return KvCacheEvents(llm)
