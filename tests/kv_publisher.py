"""A replica's KV-cache events as vLLM serves them: its publisher (in a process of its own: `python -m
tests.kv_publisher`) and its HTTP answers about them (`replica_app`).

vLLM's `ZmqEventPublisher` (vllm/distributed/kv_events.py) binds a PUB socket and sends each batch as three frames:
the topic, the sequence number (8 bytes, big-endian), and a msgpack `KVEventBatch` (an array-like struct: ts, the
events, the data-parallel rank), its events tagged structs (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`, the
tag in `type`). The structs below declare the fields vLLM 0.32's do, with its struct options.

It binds two PUB sockets on tcp://127.0.0.1 (the second one for a control: the same work, nobody following), prints
their ports, then follows JSON lines on stdin and prints `done` after each:
- {"batch": [event, ...]}: one batch of events given as dicts of those fields (a `type`, then the fields);
- {"flood": N, "per_batch": M, "control": false}: N events in batches of M, each storing one block of the same
  tokens under a hash never used before (what a replica that lies, or loses its evictions, would send), as fast as
  it can; with `control`, on the second socket.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

import msgspec
import zmq
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int]
    medium: str | None = "GPU"
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


KINDS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def replica_app(sources: dict[str, Any], metrics: str = "") -> Starlette:
    """What a vLLM replica answers about its events: `/kv_event_sources` (its publishers by data-parallel rank,
    vllm/entrypoints/serve/instrumentator/basic.py) and `/metrics`; and `/v1/models` for health checks."""

    async def kv_event_sources(request: Request) -> JSONResponse:
        return JSONResponse(sources)

    async def metrics_text(request: Request) -> PlainTextResponse:
        return PlainTextResponse(metrics)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    return Starlette(routes=[Route("/kv_event_sources", kv_event_sources), Route("/metrics", metrics_text),
                             Route("/v1/models", models)])


def source(endpoint: str) -> dict[str, Any]:
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": ""}


def main() -> None:
    sockets = [zmq.Context.instance().socket(zmq.PUB) for _ in range(2)]
    for socket in sockets:
        socket.set_hwm(100_000)  # vLLM's default
    print(*(socket.bind_to_random_port("tcp://127.0.0.1") for socket in sockets), flush=True)
    encode = msgspec.msgpack.Encoder().encode
    sequences = [itertools.count(), itertools.count()]  # each socket numbers its own batches
    hashes = itertools.count(10**12)
    for line in sys.stdin:
        command: dict[str, Any] = json.loads(line)
        if "batch" in command:
            events = [KINDS[event.pop("type")](**event) for event in command["batch"]]
            sockets[0].send_multipart([b"", next(sequences[0]).to_bytes(8, "big"),
                                       encode(KVEventBatch(time.time(), events))])
        else:
            index = 1 if command.get("control") else 0
            tokens = list(range(16))
            for _ in range(command["flood"] // command["per_batch"]):
                events = [BlockStored([next(hashes)], None, tokens, 16, kv_cache_spec_kind="full_attention")
                          for _ in range(command["per_batch"])]
                sockets[index].send_multipart([b"", next(sequences[index]).to_bytes(8, "big"),
                                               encode(KVEventBatch(time.time(), events))])
        print("done", flush=True)
    for socket in sockets:
        socket.close(linger=0)


if __name__ == "__main__":
    main()
