"""Routing over real vLLM replicas: round-robin, cache-aware on what was sent, cache-aware on the replicas' events.

    python benchmarks/vllm_routing_bench.py [--replicas 4] [--conversations 16] [--turns 12] [--front-ends 2]

Starts `--replicas` real vLLM servers (the tests' tiny gpt-oss, tests/vllm_server.py; prefix caching on, each
publishing its KV-cache events on a ZMQ port of its own, `--num-gpu-blocks-override` bounding its cache so that
evictions happen as they do on a loaded GPU), puts harmony-proxy's upstream engine in front (in this process;
`--front-ends N`: N of them, each with its own router, every request to any of them, as harmony-proxy replicas
behind a load balancer without affinity), and runs the same multi-turn agent workload under each policy: many
conversations at once, each growing every turn (a shared system prompt, then user messages and answers), as
stateless Chat Completions. Between policies every replica's prefix cache is reset (`POST /reset_prefix_cache`,
vLLM's development endpoint). Every figure comes from the replicas' own counters (`/metrics`): the prefix-cache hit
ratio (`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`, in tokens), the tokens prefilled (the
queries less the hits), and the requests each replica served (`vllm:request_success_total`), whose max over mean
is the load imbalance. Ratios are against round-robin in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.routing_bench import Servers, words
from parsers.vocab import load_vocab
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.upstream.engine import UpstreamEngine
from proxy.state import ServerState
from tests.vllm_server import VllmServer, free_port, kv_event_flags, write_tiny_gpt_oss

POLICIES = {  # name: (routing, route on the replicas' KV-cache events)
    "round-robin": ("round-robin", False),
    "cache-aware (sent)": ("cache-aware", False),
    "cache-aware (events)": ("cache-aware", True),
}
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total")


async def conversation(client: httpx.AsyncClient, urls: list[str], name: int, args: argparse.Namespace,
                       system: str, model: str) -> None:
    rng = random.Random(name)
    messages = [{"role": "system", "content": system}]
    await asyncio.sleep(rng.random() * args.stagger)
    for _turn in range(args.turns):
        messages.append({"role": "user", "content": words(rng, args.user_words)})
        url = rng.choice(urls)  # a load balancer without affinity in front of the front ends
        response = await client.post(url + "/v1/chat/completions", json={
            "model": model, "messages": messages, "max_tokens": args.answer_tokens, "temperature": 0})
        response.raise_for_status()
        message = response.json()["choices"][0]["message"]
        messages.append({"role": "assistant", "content": message.get("content") or "(no answer)"})
        await asyncio.sleep(rng.random() * args.think)


async def reset_caches(replicas: list[VllmServer]) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        for replica in replicas:
            (await client.post(replica.url + "/reset_prefix_cache")).raise_for_status()


def counters(replicas: list[VllmServer]) -> list[dict[str, float]]:
    return [{name: replica.metrics().get(name, 0.0) for name in COUNTERS} for replica in replicas]


async def run(policy: str, replicas: list[VllmServer], args: argparse.Namespace) -> dict[str, Any]:
    routing, events = POLICIES[policy]
    await reset_caches(replicas)
    vocab = load_vocab()
    servers = Servers()
    proxies = []
    for _ in range(args.front_ends):  # each its own router, as harmony-proxy replicas or --workers processes are
        engine = UpstreamEngine(vocab, [replica.base_url for replica in replicas], replicas[0].model,
                                routing=routing, kv_events=events)
        config = ServerConfig(served_model_name=replicas[0].model)
        proxies.append(await servers.start(create_app(ServerState(config, vocab, engine))))
    if events:
        await asyncio.sleep(2.0)  # the subscriptions are made (ZMQ drops what is published before one joins)
    before = counters(replicas)
    system = words(random.Random(-1), args.system_words)
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=args.conversations)) as client:
        await asyncio.gather(*(conversation(client, proxies, name, args, system, replicas[0].model)
                               for name in range(args.conversations)))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(1.0)  # the last requests' counters are published
    after = counters(replicas)
    await servers.stop()
    delta = [{name: a[name] - b[name] for name in COUNTERS} for a, b in zip(after, before, strict=True)]
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    served = [int(d["vllm:request_success_total"]) for d in delta]
    return {
        "hit ratio": hits / queries if queries else 0.0,
        "prefilled k tokens": (queries - hits) / 1000,
        "requests/replica": served,
        "load imbalance (max/mean)": max(served) / (sum(served) / len(served)) if sum(served) else 0.0,
        "wall s": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--system-words", type=int, default=300, help="the shared system prompt (~3 tokens a word)")
    parser.add_argument("--user-words", type=int, default=200, help="what each turn adds before the answer")
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=300,
                        help="KV-cache blocks (of 128 tokens on CPU) each replica holds: about its share of the "
                             "workload, so that copies of a conversation on several replicas evict each other")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--front-ends", type=int, default=1,
                        help="harmony-proxy front ends (each with its own router), every request to any of them")
    parser.add_argument("--stagger", type=float, default=3.0, help="conversations start within this many seconds")
    parser.add_argument("--think", type=float, default=0.3, help="pause between a conversation's turns, at most")
    args = parser.parse_args()
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache between policies
    folder = Path(tempfile.mkdtemp(prefix="vllm-routing-"))
    model = write_tiny_gpt_oss(folder / "model", tokenizer_cache=Path(tempfile.gettempdir()) / "harmony-proxy-tok")
    replicas = []
    try:
        for number in range(args.replicas):
            replicas.append(VllmServer(model, [*kv_event_flags(free_port()),
                                               "--num-gpu-blocks-override", str(args.kv_blocks),
                                               "--max-model-len", str(args.max_model_len)],
                                       log_path=folder / f"replica-{number}.log").start())
        for replica in replicas:
            replica.wait_ready()
        results = {policy: asyncio.run(run(policy, replicas, args)) for policy in POLICIES}
    finally:
        for replica in replicas:
            with contextlib.suppress(Exception):
                replica.stop()
    print(f"{args.replicas} vLLM replicas (tiny gpt-oss, {args.kv_blocks} KV blocks each), {args.front_ends} "
          f"harmony-proxy front end(s), {args.conversations} conversations x {args.turns} turns; figures from the "
          "replicas' own /metrics")
    baseline = results["round-robin"]
    print(f"{'':28}" + "".join(f"{policy:>24}" for policy in POLICIES))
    for key in baseline:
        cells = []
        for policy in POLICIES:
            value = results[policy][key]
            if isinstance(value, float):
                ratio = f" ({value / baseline[key]:.2f}x)" if baseline[key] and policy != "round-robin" else ""
                cells.append(f"{value:.3f}{ratio}")
            else:
                cells.append(str(value))
        print(f"{key:28}" + "".join(f"{cell:>24}" for cell in cells))


if __name__ == "__main__":
    main()
