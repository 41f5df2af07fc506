"""Cache-aware routing against round-robin, over fake engine replicas that model a prefix cache.

    python benchmarks/routing_bench.py [--replicas 4] [--conversations 32] [--turns 8]

Each replica is a `/v1/completions` server (vLLM's shape: token ids in, token ids out) that models what matters for
routing, faithfully: a prefix cache (a bounded LRU of token blocks of 16, as vLLM's; a prompt's cached part is its
longest run of leading blocks the cache holds), one prefill queue (a GPU prefills one batch at a time; here one
request at a time, taking `--prefill-us` per uncached token), and `cached_tokens` reported in
`usage.prompt_tokens_details`, as vLLM reports it. The workload is many agent conversations at once, each growing
every turn (a shared system prompt, then user messages and answers), sent as stateless Chat Completions through
harmony-proxy's upstream engine. The same workload runs under both policies in one run, on fresh replicas, and the
figures print side by side: the replicas' cache hit ratio, time to first token, and how evenly the replicas were
loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parsers.vocab import Vocab, load_vocab
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.upstream.engine import UpstreamEngine
from proxy.state import ServerState

MODEL = "openai/gpt-oss-20b"
CACHE_BLOCK = 16  # vLLM's default block size


class Replica:
    """One engine replica: a prefix cache of token blocks, one prefill queue, and the counts to report."""

    def __init__(self, vocab: Vocab, cache_blocks: int, prefill_us: float, answer: list[int]) -> None:
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.cache_blocks = cache_blocks
        self.prefill_seconds_per_token = prefill_us / 1e6
        self.answer = answer
        self.prefill = asyncio.Lock()
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.busy_seconds = 0.0
        self.app = Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                     Route("/v1/models", self.models)])

    def _keys(self, prompt: list[int]) -> list[int]:
        keys, key = [], 0
        for start in range(0, len(prompt) - CACHE_BLOCK + 1, CACHE_BLOCK):
            key = hash((key, tuple(prompt[start : start + CACHE_BLOCK])))
            keys.append(key)
        return keys

    def _cached(self, keys: list[int]) -> int:
        hit = 0
        for key in keys:
            if key not in self.cache:
                break
            hit += 1
        return hit * CACHE_BLOCK

    def _remember(self, keys: list[int]) -> None:
        for key in reversed(keys):  # the prompt's first blocks most recent: evicted last, as vLLM frees a tail first
            self.cache[key] = None
            self.cache.move_to_end(key)
        while len(self.cache) > self.cache_blocks:
            self.cache.popitem(last=False)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        # Headers at once, as vLLM and trtllm-serve answer; the prefill is the wait for the first token.
        return StreamingResponse(self._stream(body["prompt"]), media_type="text/event-stream")

    async def _stream(self, prompt: list[int]) -> Any:
        keys = self._keys(prompt)
        async with self.prefill:
            started = time.perf_counter()
            cached = self._cached(keys)
            await asyncio.sleep((len(prompt) - cached) * self.prefill_seconds_per_token)
            self._remember(keys)
            self.busy_seconds += time.perf_counter() - started
        self.requests += 1
        self.prompt_tokens += len(prompt)
        self.cached_tokens += cached
        for index, token in enumerate(self.answer):
            last = index == len(self.answer) - 1
            chunk = {"choices": [{"index": 0, "text": "", "token_ids": [token],
                                  "finish_reason": "stop" if last else None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(self.answer),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"


class Servers:
    """ASGI apps under uvicorn, as tasks of this event loop, on loopback ports."""

    def __init__(self) -> None:
        self._servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(self, app: Any) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        self._servers.append((server, task))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        for server, _ in self._servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in self._servers))


def words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(50_000)}" for _ in range(count))


async def conversation(client: httpx.AsyncClient, url: str, name: int, args: argparse.Namespace, system: str,
                       ttfts: list[float]) -> None:
    rng = random.Random(name)
    messages = [{"role": "system", "content": system}]
    await asyncio.sleep(rng.random() * args.stagger)  # conversations start at different times
    for _turn in range(args.turns):
        messages.append({"role": "user", "content": words(rng, args.user_words)})
        started = time.perf_counter()
        content, first = "", None
        async with client.stream("POST", url + "/v1/chat/completions", json={
                "model": MODEL, "messages": messages, "stream": True}) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    first = first or time.perf_counter()
                    content += delta["content"]
        ttfts.append((first or time.perf_counter()) - started)
        messages.append({"role": "assistant", "content": content})
        await asyncio.sleep(rng.random() * args.think)  # the agent runs its tool, the user reads


async def run(policy: str, vocab: Vocab, args: argparse.Namespace) -> dict[str, Any]:
    answer = vocab.encode_harmony("<|channel|>final<|message|>" + " ".join(["Done."] * args.answer_words)
                                  + "<|return|>")
    replicas = [Replica(vocab, args.cache_blocks, args.prefill_us, answer) for _ in range(args.replicas)]
    servers = Servers()
    urls = [await servers.start(replica.app) + "/v1" for replica in replicas]
    engine = UpstreamEngine(vocab, urls, MODEL, routing=policy)
    proxy = await servers.start(create_app(ServerState(ServerConfig(), vocab, engine)))
    system = words(random.Random(-1), args.system_words)
    ttfts: list[float] = []
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=args.conversations)) as client:
        await asyncio.gather(*(conversation(client, proxy, name, args, system, ttfts)
                               for name in range(args.conversations)))
    elapsed = time.perf_counter() - started
    await servers.stop()
    loads = [replica.requests for replica in replicas]
    prefilled = [replica.prompt_tokens - replica.cached_tokens for replica in replicas]
    busy = [replica.busy_seconds for replica in replicas]
    ttfts.sort()
    return {
        "hit ratio": sum(r.cached_tokens for r in replicas) / sum(r.prompt_tokens for r in replicas),
        "TTFT p50 s": statistics.median(ttfts),
        "TTFT p99 s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
        "requests/replica": loads,
        "request imbalance (max/min)": max(loads) / max(1, min(loads)),
        "prefill busy s/replica": [round(b, 2) for b in busy],
        "busy imbalance (max/min)": max(busy) / max(1e-9, min(busy)),
        "prefilled Mtokens": sum(prefilled) / 1e6,
        "wall s": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=1000, help="the shared system prompt (~2 tokens a word)")
    parser.add_argument("--user-words", type=int, default=800, help="what each turn adds before the answer")
    parser.add_argument("--answer-words", type=int, default=60)
    parser.add_argument("--cache-blocks", type=int, default=15000,
                        help="blocks of 16 tokens each replica's prefix cache holds "
                             "(default: its share of the workload)")
    parser.add_argument("--prefill-us", type=float, default=10.0, help="prefill time per uncached prompt token")
    parser.add_argument("--stagger", type=float, default=2.0, help="conversations start within this many seconds")
    parser.add_argument("--think", type=float, default=0.3, help="pause between a conversation's turns, at most")
    args = parser.parse_args()
    vocab = load_vocab()
    results = {policy: asyncio.run(run(policy, vocab, args)) for policy in ("round-robin", "cache-aware")}
    print(f"{args.replicas} replicas, {args.conversations} conversations x {args.turns} turns, "
          f"cache {args.cache_blocks} blocks of {CACHE_BLOCK} per replica, prefill {args.prefill_us} us/token")
    rr, ca = results["round-robin"], results["cache-aware"]
    print(f"{'':30} {'round-robin':>24} {'cache-aware':>24} {'ratio':>8}")
    for key in rr:
        a, b = rr[key], ca[key]
        ratio = f"{b / a:8.2f}" if isinstance(a, float) and a else ""
        show = (lambda v: f"{v:24.3f}") if isinstance(a, float) else (lambda v: f"{v!s:>24}")
        print(f"{key:30} {show(a)} {show(b)} {ratio}")


if __name__ == "__main__":
    main()
