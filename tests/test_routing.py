"""Routing over several upstream replicas: by prompt prefix, bounded by load, with session keys as hints."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx

from proxy.engines.upstream.engine import UpstreamEngine
from proxy.engines.upstream.routing import BLOCK_TOKENS, CacheAwareRouter, RoundRobinRouter, block_keys
from tests.conftest import MODEL, LiveServer
from tests.fake_upstreams import fake_upstream
from tests.test_upstream import dead_url

ANSWER = "<|channel|>analysis<|message|>Fine.<|end|><|start|>assistant<|channel|>final<|message|>Noted.<|return|>"


def tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200_000) for _ in range(count)]


def send(router: CacheAwareRouter, prompt: list[int], request_id: str, hints: tuple[str, ...] = (),
         finish: bool = False) -> int:
    """Route and send a request to the first choice; `finish`: it also ends at once."""
    route = router.route(prompt, hints)
    router.sent(route, route.order[0], request_id)
    if finish:
        router.finished(route, route.order[0])
    return route.order[0]


def test_block_keys_are_equal_exactly_for_equal_prefixes() -> None:
    base = tokens(10 * BLOCK_TOKENS + 5, 1)
    keys = block_keys(base)
    assert len(keys) == 10
    changed = list(base)
    changed[3 * BLOCK_TOKENS] += 1  # a sampled position of block 3
    other = block_keys(changed)
    assert other[:3] == keys[:3] and all(a != b for a, b in zip(other[3:], keys[3:], strict=True))
    assert block_keys(base + tokens(BLOCK_TOKENS, 2))[:10] == keys


def test_a_growing_conversation_stays_on_its_replica_and_new_ones_spread() -> None:
    router = CacheAwareRouter(4)
    system = tokens(2 * BLOCK_TOKENS, 0)  # the prefix every conversation shares
    prompts = {name: system + tokens(500, name) for name in range(8)}
    homes = {}
    for name, prompt in prompts.items():
        homes[name] = send(router, prompt, f"resp_{name}_0")  # in flight: each new one takes the least loaded
    assert sorted(homes.values()) == [0, 0, 1, 1, 2, 2, 3, 3]
    router.in_flight = [0] * 4
    # Every conversation keeps its replica as it grows, the load staying even.
    for turn in range(1, 4):
        for name, prompt in prompts.items():
            prompts[name] = prompt + tokens(300, 1000 * turn + name)
            assert send(router, prompts[name], f"resp_{name}_{turn}", finish=True) == homes[name]


def test_a_session_hint_decides_between_replicas_that_match_equally() -> None:
    router = CacheAwareRouter(3)
    first = send(router, tokens(10, 1), "resp_a", ("key:a",), finish=True)  # shorter than a block: no match
    for _ in range(5):
        route = router.route(tokens(10, 2), ("resp_a",))
        assert route.order[0] == first
        route = router.route(tokens(10, 3), ("key:a",))
        assert route.order[0] == first


def test_a_hot_conversation_cannot_pin_one_replica() -> None:
    router = CacheAwareRouter(4, load_factor=1.25)
    prompt = tokens(20 * BLOCK_TOKENS, 7)
    chosen = [send(router, prompt, f"r{i}") for i in range(16)]  # all in flight at once
    counts = [chosen.count(replica) for replica in range(4)]
    assert max(counts) <= 8, counts  # spread within the load bound, though one replica holds the whole prefix
    assert counts[chosen[0]] == max(counts)  # the replica with the prefix takes the largest share


def test_forgotten_blocks_no_longer_attract_the_prompt() -> None:
    router = CacheAwareRouter(2, cache_blocks=30)
    old = tokens(20 * BLOCK_TOKENS, 1)
    home = send(router, old, "old", finish=True)
    assert router.route(old).matched_blocks[home] == 20
    for seed in range(3, 6):  # fill the first replica's memory with other prompts
        route = router.route(tokens(20 * BLOCK_TOKENS, seed))
        router.sent(route, home, f"fill{seed}")
        router.finished(route, home)
    assert router.route(old).matched_blocks[home] == 0


def test_round_robin_takes_turns() -> None:
    router = RoundRobinRouter(3)
    assert [router.route([]).order[0] for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def replicas(vocab: Any, count: int) -> list[Any]:
    return [fake_upstream(vocab, "vllm", ANSWER) for _ in range(count)]


def test_turns_of_a_conversation_reach_the_replica_that_served_it(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    apps = replicas(vocab, 3)
    urls = [serve_app(app).base_url + "/v1" for app in apps]
    proxy = serve(engine=UpstreamEngine(vocab, urls, MODEL))
    conversations: dict[int, list[dict[str, Any]]] = {
        name: [{"role": "system", "content": "You help. " * 50},
               {"role": "user", "content": " ".join(f"topic{name}x{i}" for i in range(100))}]
        for name in range(6)
    }
    served: dict[int, set[int]] = {name: set() for name in conversations}
    for _turn in range(3):
        for name, messages in conversations.items():
            before = [len(app.state.seen) for app in apps]
            reply = httpx.post(proxy.base_url + "/v1/chat/completions",
                               json={"model": MODEL, "messages": messages}, timeout=30).json()
            served[name] |= {i for i, app in enumerate(apps) if len(app.state.seen) > before[i]}
            messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                         {"role": "user", "content": f"and then, {name}? " * 30}]
    assert all(len(replicas_used) == 1 for replicas_used in served.values()), served
    assert len(set().union(*served.values())) >= 2  # new conversations spread, even one after another


def test_a_session_header_keeps_short_prompts_together_and_round_robin_ignores_it(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    apps = replicas(vocab, 3)
    urls = [serve_app(app).base_url + "/v1" for app in apps]
    for routing, together in (("cache-aware", True), ("round-robin", False)):
        proxy = serve(engine=UpstreamEngine(vocab, urls, MODEL, routing=routing))
        before = [len(app.state.seen) for app in apps]
        for question in ("Hi", "Why?", "Sure?"):
            response = httpx.post(proxy.base_url + "/v1/chat/completions", headers={"session-id": "thread-1"},
                                  json={"model": MODEL, "messages": [{"role": "user", "content": question}]})
            assert response.status_code == 200
        used = [i for i, app in enumerate(apps) if len(app.state.seen) > before[i]]
        assert (len(used) == 1) is together, (routing, used)


def test_a_dead_replica_is_passed_over(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    app = fake_upstream(vocab, "vllm", ANSWER)
    urls = [dead_url(), serve_app(app).base_url + "/v1", dead_url()]
    proxy = serve(engine=UpstreamEngine(vocab, urls, MODEL))
    for name in range(4):
        response = httpx.post(proxy.base_url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": f"Question {name} " * 100}]})
        assert response.status_code == 200
    assert len(app.state.seen) == 4
