"""A replica floods harmony-proxy with KV-cache events: the server keeps answering, its memory stays bounded.

A real server (`python -m proxy serve --engine upstream`, two replicas), a real publisher in a process of its own
(tests/kv_publisher.py: vLLM's wire format, as fast as it can), and the replicas' HTTP answers (`/kv_event_sources`,
`/metrics` saying the cache holds 1,000 blocks, `/v1/models`). `/health` is asked back to back while the publisher
floods a socket nobody follows (the control: the same work on this machine), then while it floods the socket the
server follows. Before, a flood of 1 M events held /health 64 s (control 0.27 s): each batch was applied in one go,
and `recv_multipart()` with messages queued returns without yielding.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest

from proxy.engines.upstream.kv_subscriber import MAX_MESSAGE_BYTES
from tests.conftest import LiveServer
from tests.kv_publisher import replica_app, source
from tests.vllm_server import free_port

ROOT = Path(__file__).resolve().parent.parent
FLOOD = 200_000  # events, each storing one block under a new hash: ~20 MB
PER_BATCH = 1_000
CACHE_BLOCKS = 1_000
BLOCK = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(16)),
         "block_size": 16, "kv_cache_spec_kind": "full_attention"}


class Publisher:
    """tests/kv_publisher.py in its own process."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.kv_publisher"], cwd=ROOT, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        self.port, self.control_port = map(int, self.process.stdout.readline().split())

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "done"

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


class HealthWatch:
    """GET /health back to back in a thread: the longest answer is how long the server's loop was held."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.longest = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=300) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get(self._url + "/health").status_code == 200
                self.longest = max(self.longest, time.perf_counter() - started)
                self.answers += 1
                time.sleep(0.002)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def scrape(url: str) -> dict[str, float]:
    """harmony_proxy:kv_event_* samples, by name and labels as written."""
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith("harmony_proxy:kv_event"):
            name, _, value = line.rpartition(" ")
            samples[name.replace('model_name="m",', "")] = float(value)
    return samples


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    started = Publisher()
    yield started
    started.stop()


@pytest.fixture
def server(publisher: Publisher, serve_app: Callable[[Any], LiveServer], tmp_path: Path) -> Iterator[str]:
    metrics = f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{CACHE_BLOCKS}"}} 1.0\n'
    replica = serve_app(replica_app({"0": source(f"tcp://*:{publisher.port}")}, metrics))
    silent = serve_app(replica_app({}))  # publishes nothing
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--engine", "upstream", "--upstream-url", replica.base_url + "/v1",
             "--upstream-url", silent.base_url + "/v1", "--served-model-name", "m", "--host", "127.0.0.1", "--port",
             str(port), "--store-path", str(tmp_path / "store.sqlite3"), "--upstream-kv-events-budget", "0.5"],
            cwd=ROOT, stdout=output, stderr=output)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def held_on(url: str) -> float:
    return next((value for name, value in scrape(url).items() if name.startswith("harmony_proxy:kv_event_blocks")),
                0.0)


def flood(publisher: Publisher, url: str, control: bool) -> tuple[HealthWatch, float, float]:
    """/health watched while the publisher floods, until the server has read all it was sent (a last batch that
    leaves one block, repeated: it may be dropped too); how long that took, and the most blocks held meanwhile."""
    started = time.monotonic()
    largest = 0.0
    with HealthWatch(url) as watch:
        time.sleep(0.2)
        publisher.send({"flood": FLOOD, "per_batch": PER_BATCH, "control": control})
        while not control and (held := held_on(url)) != 1:
            largest = max(largest, held)
            publisher.send({"batch": [{"type": "AllBlocksCleared"}, BLOCK]})
            time.sleep(0.2)
        time.sleep(0.5)
    return watch, time.monotonic() - started, largest


def test_a_flood_of_kv_events_neither_holds_the_server_nor_grows_its_memory(publisher: Publisher, server: str) -> None:
    # ZMQ delivers only what is published after the subscription joins: publish until the server has read one.
    while held_on(server) == 0:
        publisher.send({"batch": [BLOCK]})
        time.sleep(0.1)

    control, _, _ = flood(publisher, server, control=True)
    before = scrape(server)
    flooded, took, largest = flood(publisher, server, control=False)
    counts = scrape(server)
    print(f"\n/health held at most {flooded.longest * 1000:.0f} ms during a flood of {FLOOD:,} events "
          f"(control, the same flood unfollowed: {control.longest * 1000:.0f} ms; {flooded.answers} and "
          f"{control.answers} answers), {took:.1f} s in all, at most {largest:.0f} blocks held; {counts}")

    def total(samples: dict[str, float], metric: str, outcome: str) -> float:
        return sum(value for name, value in samples.items() if name.startswith(metric) and f'"{outcome}"' in name)

    batches, size = "harmony_proxy:kv_event_batches_total", "harmony_proxy:kv_event_bytes_total"
    assert total(counts, batches, "applied") > total(before, batches, "applied")  # within the budget, read
    assert total(counts, batches, "dropped") + total(counts, batches, "missed") > 0  # the rest dropped or never queued
    # The budget held: 0.5 MiB/s, after a burst of one largest message.
    assert total(counts, size, "applied") - total(before, size, "applied") <= MAX_MESSAGE_BYTES + took * 0.5 * 2**20
    assert largest <= CACHE_BLOCKS  # bounded by what the replica says its cache holds
    # Generous against the control: before, the flood (applied in one go) held /health 23 times longer (1.9 s
    # against 84 ms); at 1 M events, 7.1 s against 0.21 s.
    assert flooded.longest < 10 * control.longest, (flooded.longest, control.longest)

