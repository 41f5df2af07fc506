"""Following a replica's KV-cache events: where its publishers are, and reading them as the untrusted input they are.

vLLM (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`) publishes each engine step's events as one ZMQ message
of three frames: a topic, an 8-byte sequence number, and a msgpack `KVEventBatch` (`[ts, [events...], dp_rank]`).
`GET /kv_event_sources` on the replica lists a publisher per data-parallel rank (`{"0": {...}, "1": {...}}`), each
rank with a cache of its own: every one is followed, into a `HeldBlocks` each of the replica's `ReplicaBlocks`.

Where to listen. vLLM binds an endpoint with a wildcard (`tcp://*:PORT`, reached at the replica's own host) or an
ipc path (and publishes `tcp://*:0` as the address it bound), and connects to any other address, expecting the
listener to bind it. harmony-proxy only connects: to the replica's own host, or to an ipc path of a replica on this
host. It binds only an address named by `--upstream-kv-events-bind`, and only when a replica names exactly that
address: a replica cannot make harmony-proxy listen where it says (`tcp://0.0.0.0:P` would let anyone who reaches
that port forge the replica's events).

Reading. Nothing here holds the event loop for long, whatever a replica sends: a message is at most
`MAX_MESSAGE_BYTES` (ZMQ refuses a larger one and drops the connection; it is opened again), at most `_QUEUED`
messages wait in ZMQ, and each replica has a budget in bytes per second (`EventBudget`, a token bucket). A batch
past the budget is dropped unread and that rank's view cleared (a dropped batch may have held evictions), logged
once, counted (`EventCounts`, shown in /metrics). A batch within it is split into its events without decoding them,
and the events are decoded and applied a slice at a time, the loop free between slices. `recv_multipart()` on a
socket with messages queued returns without yielding, so the reader also yields after every message.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec
import zmq
import zmq.asyncio

from proxy.engines.upstream.kv_events import HeldBlocks, ReplicaBlocks

logger = logging.getLogger("harmony_proxy.engine")

MAX_MESSAGE_BYTES = 4 * 2**20  # one engine step's events: vLLM's largest steps publish well under 1 MiB
MAX_RANKS = 64  # publishers followed per replica
_QUEUED = 32  # messages ZMQ keeps for us (its receive high-water mark): at most 128 MiB waiting
_SLICE_EVENTS = 64  # events decoded and applied between two turns of the event loop: ~0.5 ms
_SLICE_BYTES = 16 * 2**10
_DISCOVERY_BYTES = 2**20  # a /kv_event_sources answer
_METRICS_BYTES = 8 * 2**20  # a /metrics answer, read for the replica's cache size
_RETRY_SECONDS = 5.0
_REOPEN_SECONDS = 1.0
_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class _Batch(msgspec.Struct, array_like=True):
    """vLLM's `KVEventBatch` (`EventBatch`: array-like `ts, events, data_parallel_rank`), its events left encoded."""

    ts: float
    events: list[msgspec.Raw]


_BATCH = msgspec.msgpack.Decoder(_Batch)
_EVENT = msgspec.msgpack.Decoder()


@dataclass
class EventBudget:
    """What one replica's events may cost: bytes per second, and a burst (a token bucket)."""

    bytes_per_second: float = 2 * 2**20
    burst_bytes: float = MAX_MESSAGE_BYTES  # at least one message of the largest size


@dataclass
class EventCounts:
    """What became of one replica's event batches (harmony_proxy:kv_event_* in /metrics)."""

    applied_batches: int = 0
    applied_bytes: int = 0
    dropped_batches: int = 0  # past the budget
    dropped_bytes: int = 0
    malformed_batches: int = 0
    missed_batches: int = 0  # gaps in the publisher's numbering: lost on the way (ZMQ drops what we cannot take)
    disconnects: int = 0


@dataclass(frozen=True)
class Publisher:
    rank: str
    address: str
    bind: bool


def find_publishers(replica_url: str, sources: Any,
                    bindable: Collection[str] = ()) -> tuple[list[Publisher], list[str]]:
    """The publishers a replica's `/kv_event_sources` answer lists that harmony-proxy may follow, and why any other
    was refused. `bindable`: the addresses `--upstream-kv-events-bind` allows binding."""
    if not isinstance(sources, dict):
        return [], []
    publishers: list[Publisher] = []
    refused: list[str] = []
    host = urlsplit(replica_url).hostname or "127.0.0.1"
    for rank, source in list(sources.items())[:MAX_RANKS]:
        if not isinstance(source, dict) or not source.get("enable_kv_cache_events") or source.get("publisher") != "zmq":
            continue
        endpoint = source.get("endpoint")
        if not isinstance(endpoint, str) or len(endpoint) > 256:
            refused.append(f"rank {rank}: no endpoint")
        elif endpoint.startswith("ipc://"):
            if _is_loopback(host):
                publishers.append(Publisher(str(rank), endpoint, False))
            else:
                refused.append(f"rank {rank}: {endpoint} is a path on another host")
        elif not endpoint.startswith("tcp://"):
            refused.append(f"rank {rank}: {endpoint} is not reachable from another process")
        elif "*" in endpoint or "::" in endpoint:  # vLLM binds these: its port, at the replica's host
            port = endpoint.rpartition(":")[2]
            address = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
            publishers.append(Publisher(str(rank), address, False))
        elif endpoint in bindable:  # vLLM connects to this address: ours, as the operator allowed
            publishers.append(Publisher(str(rank), endpoint, True))
        elif urlsplit(endpoint.replace("tcp://", "http://", 1)).hostname == host:
            # At the replica's own host: vLLM bound it (`tcp://*:0` is published as the address it bound), or
            # connects to itself; connecting there is safe either way.
            publishers.append(Publisher(str(rank), endpoint, False))
        else:
            refused.append(f"rank {rank}: it connects to {endpoint}, which harmony-proxy would have to listen on "
                           "(allow it with --upstream-kv-events-bind)")
    return publishers, refused


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def cache_capacity(metrics_text: str) -> dict[str, int]:
    """Tokens each engine's GPU cache holds, by data-parallel rank, from vLLM's `vllm:cache_config_info` gauge
    (`vllm/v1/metrics/loggers.py`: the `CacheConfig` as labels, `engine` the rank)."""
    found: dict[str, int] = {}
    for match in _CACHE_INFO.finditer(metrics_text):
        labels = dict(_LABEL.findall(match.group(1)))
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit():
            found[labels.get("engine", "0")] = int(blocks) * int(size)
    return found


class _Bucket:
    def __init__(self, budget: EventBudget) -> None:
        self.rate, self._burst = budget.bytes_per_second, budget.burst_bytes
        self._level, self._at = budget.burst_bytes, time.monotonic()

    def take(self, amount: int) -> bool:
        now = time.monotonic()
        self._level = min(self._burst, self._level + (now - self._at) * self.rate)
        self._at = now
        if amount > self._level:
            return False
        self._level -= amount
        return True


class EventSubscriber:
    """Keeps one replica's `ReplicaBlocks` current: finds its publishers, follows each within the replica's budget."""

    def __init__(self, replica_url: str, view: ReplicaBlocks, client: httpx.AsyncClient,
                 budget: EventBudget | None = None, bindable: Collection[str] = ()) -> None:
        self._url = replica_url
        self.view = view
        self._client = client
        self._bindable = frozenset(bindable)
        self._bucket = _Bucket(budget or EventBudget())
        self.counts = EventCounts()
        self.publishers: list[Publisher] | None = None  # once found
        self._warned: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-events {self._url}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            found = await self._discover()
            if isinstance(found, list):
                break
            if found is False:
                logger.info("%s publishes no KV-cache events: routing to it on what was sent there", self._url)
                return
            await asyncio.sleep(_RETRY_SECONDS)
        capacity = await self._capacity()
        ranks = [HeldBlocks(capacity_tokens=capacity.get(publisher.rank)) for publisher in found]
        self.view.ranks = ranks
        self.publishers = found
        logger.info("routing on the KV-cache events of %s (%s)", self._url,
                    ", ".join(publisher.address for publisher in found))
        await asyncio.gather(*(self._follow(publisher, held) for publisher, held in zip(found, ranks, strict=True)))

    async def _follow(self, publisher: Publisher, held: HeldBlocks) -> None:
        """Read one publisher for good; a dropped connection (ZMQ does not always reconnect: an oversized message
        ends it) is opened again, the view cleared (what was published meanwhile is lost)."""
        while True:
            socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
            for option, value in ((zmq.SUBSCRIBE, b""), (zmq.LINGER, 0), (zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES),
                                  (zmq.RCVHWM, _QUEUED)):
                socket.setsockopt(option, value)
            monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            try:
                socket.bind(publisher.address) if publisher.bind else socket.connect(publisher.address)
                await self._receive(socket, monitor, held)
            except zmq.ZMQError as exc:
                logger.warning("cannot listen for the KV-cache events of %s at %s (%s): routing to it on what was "
                               "sent there", self._url, publisher.address, exc)
                return
            finally:
                socket.disable_monitor()
                monitor.close()
                socket.close()
            self.counts.disconnects += 1
            held.clear()
            await asyncio.sleep(_REOPEN_SECONDS)

    async def _receive(self, socket: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket, held: HeldBlocks) -> None:
        """Apply what the publisher sends until its connection drops."""
        poller = zmq.asyncio.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if monitor in ready:
                await monitor.recv_multipart()
                return
            if socket in ready:
                await self.take(await socket.recv_multipart(copy=False), held)
                await asyncio.sleep(0)  # the next message may be queued already: receiving it would not yield

    async def take(self, frames: list[Any], held: HeldBlocks) -> None:
        """One message from a publisher: within the budget, its events applied a slice at a time."""
        size = sum(len(frame) for frame in frames)
        if not self._bucket.take(size):
            self.counts.dropped_batches += 1
            self.counts.dropped_bytes += size
            held.clear()  # the dropped batch may have evicted blocks: nothing believed can stand
            if len(frames) == 3 and len(frames[1]) == 8:  # received: not counted as missed when the next one is read
                held.last_sequence = int.from_bytes(frames[1], "big", signed=True)
            self._warn_once("budget", "the KV-cache events of %s pass its budget (%d bytes/s): dropped, and what "
                            "it holds forgotten until it is within it (counted in harmony_proxy:kv_event_batches)",
                            self._bucket.rate)
            return
        try:
            if len(frames) != 3 or len(frames[1]) != 8:
                raise ValueError("not topic, sequence, payload")
            sequence = int.from_bytes(frames[1], "big", signed=True)
            events = _BATCH.decode(frames[2]).events
            if held.last_sequence is not None and sequence > held.last_sequence + 1:
                self.counts.missed_batches += sequence - held.last_sequence - 1
            held.batch(sequence, [])
            weight = 0
            for index, raw in enumerate(events):
                event = _EVENT.decode(raw)
                if isinstance(event, dict):
                    held.apply(event)
                weight += len(raw)
                if weight >= _SLICE_BYTES or index % _SLICE_EVENTS == _SLICE_EVENTS - 1:
                    weight = 0
                    await asyncio.sleep(0)
        except Exception:  # noqa: BLE001 - whatever a batch holds, the reader goes on (and believes nothing of it)
            self.counts.malformed_batches += 1
            held.clear()
            self._warn_once("malformed", "a KV-event batch from %s could not be read: what it holds is forgotten "
                            "until its next batch (further ones counted in harmony_proxy:kv_event_batches)")
            return
        self.counts.applied_batches += 1
        self.counts.applied_bytes += size

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message, self._url, *args)

    async def _discover(self) -> list[Publisher] | bool:
        """The publishers to follow; False when the replica publishes none we may follow; True to ask again later."""
        try:
            status, body = await self._read(f"{self._url}/kv_event_sources", _DISCOVERY_BYTES)
            if status == 404:
                return False
            if status != 200:
                return True
            publishers, refused = find_publishers(self._url, msgspec.json.decode(body), self._bindable)
        except (httpx.HTTPError, msgspec.DecodeError, ValueError, RecursionError):
            return True
        for reason in refused:
            logger.warning("not following a KV-event publisher of %s: %s", self._url, reason)
        return publishers or False

    async def _capacity(self) -> dict[str, int]:
        """Tokens each rank's cache holds, where the replica says (vLLM's /metrics); {} where it does not."""
        try:
            status, body = await self._read(f"{self._url}/metrics", _METRICS_BYTES)
        except (httpx.HTTPError, ValueError):
            return {}
        return cache_capacity(body.decode("utf-8", "replace")) if status == 200 else {}

    async def _read(self, url: str, limit: int) -> tuple[int, bytes]:
        """An answer's status and body, refused (ValueError) past `limit` bytes."""
        async with self._client.stream("GET", url, timeout=5.0) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise ValueError(f"{url} answered more than {limit} bytes")
            return response.status_code, bytes(body)
