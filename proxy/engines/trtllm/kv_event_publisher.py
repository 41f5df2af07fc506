"""Publishes an in-process engine's KV-cache events the way vLLM publishes its own, for routers to follow.

vLLM (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`) sends each batch on a ZMQ PUB socket as three frames:
the topic, an 8-byte big-endian sequence number counted from 0, and the msgpack of `KVEventBatch` (array-like:
`[ts, events, data_parallel_rank]`), whose events are tagged maps: `BlockStored`, `BlockRemoved`,
`AllBlocksCleared`. One publisher per data-parallel rank; `GET /kv_event_sources` lists each rank's
`KVEventsConfig` (`enable_kv_cache_events`, `publisher: "zmq"`, `endpoint`, ...). A publisher whose endpoint is
a wildcard binds it, and a subscriber reaches it at the replica's own host: that is the form used here (bound on
the address the server listens on, on a port the system picks).

Sending never waits: a PUB socket drops what it cannot queue, and the sequence number still advances, so a
subscriber sees the gap and forgets what it believed (vLLM's subscribers, and harmony-proxy's, do).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import msgspec
import zmq

logger = logging.getLogger("harmony_proxy.engine")

HIGH_WATER_MARK = 100_000  # vLLM's default hwm


# vLLM's classes, field for field as far as harmony-proxy fills them: the fields without a default there are sent
# always (its decoder requires them), the others only when set (omit_defaults).
class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_KINDS: dict[str, type[msgspec.Struct]] = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved,
                                           "AllBlocksCleared": AllBlocksCleared}
_REQUIRED: dict[str, dict[str, Any]] = {"BlockStored": {"lora_id": None, "medium": "GPU", "lora_name": None},
                                        "BlockRemoved": {"medium": "GPU"}, "AllBlocksCleared": {}}


class KvEventPublisher:
    """One rank's ZMQ PUB socket, bound on `host` at a port the system picks."""

    _encoder = msgspec.msgpack.Encoder()

    def __init__(self, host: str, rank: int = 0) -> None:
        self.rank = rank
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.set_hwm(HIGH_WATER_MARK)
        if ":" in host:
            self._socket.setsockopt(zmq.IPV6, 1)
        address = f"[{host}]" if ":" in host else ("*" if host in ("", "0.0.0.0") else host)
        self._socket.bind(f"tcp://{address}:0")
        port = int(self._socket.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2])
        self.endpoint = f"tcp://*:{port}"  # a wildcard: reached at the host the replica is reached at
        self._sequence = itertools.count()

    def config(self) -> dict[str, Any]:
        """This publisher as vLLM's `/kv_event_sources` lists one (its `KVEventsConfig` fields)."""
        return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
                "replay_endpoint": None, "buffer_steps": 0, "hwm": HIGH_WATER_MARK,
                "max_queue_size": HIGH_WATER_MARK, "topic": ""}

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Send one batch of events (dicts in vLLM's shape, `type` naming the kind)."""
        batch = KVEventBatch(time.time(), [_as_struct(event) for event in events], self.rank)
        sequence = next(self._sequence)
        try:
            self._socket.send_multipart((b"", sequence.to_bytes(8, "big"), self._encoder.encode(batch)),
                                        flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # dropped: the next batch's number tells subscribers one is missing

    def close(self) -> None:
        self._socket.close(linger=0)


def _as_struct(event: dict[str, Any]) -> msgspec.Struct:
    kind = event["type"]
    return _KINDS[kind](**(_REQUIRED[kind] | {key: value for key, value in event.items() if key != "type"}))


class RankPublishers:
    """One publisher per data-parallel rank (as vLLM has), bound on `host` when first needed; a rank whose publisher
    cannot bind is warned of once and not published."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._publishers: dict[int, KvEventPublisher] = {}
        self._unbound: set[int] = set()

    def open(self, ranks: int) -> bool:
        """Bind ranks 0..ranks-1 now (so that `/kv_event_sources` lists them from the start); False if none bound."""
        for rank in range(ranks):
            self._publisher(rank)
        return bool(self._publishers)

    def publish(self, rank: int, events: list[dict[str, Any]]) -> None:
        publisher = self._publishers.get(rank) or (None if rank in self._unbound else self._publisher(rank))
        if publisher is not None:
            publisher.publish(events)

    def sources(self) -> dict[str, dict[str, Any]] | None:
        """Each rank's publisher as vLLM's `/kv_event_sources` lists them; None when none publishes."""
        return {str(rank): publisher.config() for rank, publisher in self._publishers.items()} or None

    def close(self) -> None:
        for publisher in self._publishers.values():
            publisher.close()
        self._publishers.clear()

    def _publisher(self, rank: int) -> KvEventPublisher | None:
        try:
            publisher = self._publishers[rank] = KvEventPublisher(self._host, rank)
        except zmq.ZMQError as exc:
            self._unbound.add(rank)
            logger.warning("KV-cache events of rank %d NOT published: cannot bind on %s (%s)", rank, self._host, exc)
            return None
        logger.info("publishing KV-cache events of rank %d (ZMQ, as vLLM) at %s", rank, publisher.endpoint)
        return publisher
