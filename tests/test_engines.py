"""The engine interface as the server uses it: what reaches the engine, and how playback honours it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from parsers.vocab import Vocab
from proxy.engines.base import GenerationRequest, SamplingParams, Step
from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, WEATHER
from tools.definitions import ToolChoice

TWO_TURNS = "<|channel|>final<|message|>one<|return|><|start|>assistant<|channel|>final<|message|>two<|return|>"


def play(vocab: Vocab, completion: str, **sampling: Any) -> list[Step]:
    engine = scripted_engine(vocab, [completion])
    params = SamplingParams(**{"max_tokens": 100, "stop_token_ids": vocab.stop_token_ids, **sampling})

    async def collect() -> list[Step]:
        return [step async for step in engine.generate(GenerationRequest("r", [1, 2, 3], params))]

    return asyncio.run(collect())


def test_playback_stops_on_the_first_stop_token_and_counts_usage(vocab: Vocab) -> None:
    steps = play(vocab, TWO_TURNS)
    tokens = [t for step in steps for t in step.token_ids]
    assert tokens == vocab.encode_harmony("<|channel|>final<|message|>one<|return|>")
    assert all(len(step.token_ids) == 1 for step in steps[:-1])  # one token per step
    assert steps[-1].finish_reason == "stop" and steps[-1].usage.completion_tokens == len(tokens)
    assert steps[-1].usage.prompt_tokens == 3


def test_playback_honours_max_tokens_min_tokens_and_ignore_eos(vocab: Vocab) -> None:
    whole = vocab.encode_harmony(TWO_TURNS)
    first_stop = whole.index(vocab.special.return_) + 1
    cut = play(vocab, TWO_TURNS, max_tokens=4)
    assert cut[-1].finish_reason == "length" and cut[-1].usage.completion_tokens == 4
    past_first = play(vocab, TWO_TURNS, min_tokens=first_stop + 1)
    assert past_first[-1].finish_reason == "stop" and past_first[-1].usage.completion_tokens == len(whole)
    ignoring = play(vocab, TWO_TURNS, ignore_eos=True)
    assert ignoring[-1].finish_reason == "length" and ignoring[-1].usage.completion_tokens == len(whole)


def test_completion_without_a_stop_token_finishes_with_length(vocab: Vocab) -> None:
    assert play(vocab, "<|channel|>final<|message|>unfinished")[-1].finish_reason == "length"


def test_a_paced_engine_hands_a_late_consumer_every_step_generated_meanwhile(vocab: Vocab) -> None:
    """With a delay the engine keeps its own pace, as a GPU does; what waited while the consumer was busy comes as
    one step, and the stop token still ends it."""
    engine = scripted_engine(vocab, [TWO_TURNS], token_delay=0.01)
    params = SamplingParams(max_tokens=100, stop_token_ids=vocab.stop_token_ids)

    async def consume(busy: float) -> tuple[list[Step], float]:
        loop = asyncio.get_running_loop()
        steps, began = [], loop.time()
        async for step in engine.generate(GenerationRequest("r", [1], params)):
            steps.append(step)
            if len(steps) == 1:
                await asyncio.sleep(busy)  # the consumer falls behind by `busy`
        return steps, loop.time() - began

    prompt, prompt_took = asyncio.run(consume(0.0))
    late, late_took = asyncio.run(consume(0.045))
    whole = vocab.encode_harmony("<|channel|>final<|message|>one<|return|>")
    for steps in (prompt, late):
        assert [t for step in steps for t in step.token_ids] == whole
        assert steps[-1].finish_reason == "stop" and steps[-1].usage.completion_tokens == len(whole)
    assert all(len(step.token_ids) == 1 for step in prompt[:-1])
    assert len(late[1].token_ids) >= 4  # the steps of the 45 ms it was away
    # The pace is the engine's: falling behind did not slow it down (it would take 45 ms longer if it did).
    assert late_took < prompt_took + 0.03


def test_every_generation_field_reaches_the_engine(serve: Callable[..., LiveServer], vocab: Vocab) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "q"}],
        "max_completion_tokens": 77, "temperature": 0.3, "top_p": 0.9, "seed": 42, "min_tokens": 2,
        "ignore_eos": True, "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    assert httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    request = engine.requests[-1]
    assert request.sampling == SamplingParams(
        max_tokens=77, temperature=0.3, top_p=0.9, seed=42, stop_token_ids=vocab.stop_token_ids, min_tokens=2,
        ignore_eos=True,
    )
    assert request.constraint.tool_choice == ToolChoice("function", "get_weather")
    assert [tool.name for tool in request.constraint.tools] == ["get_weather"]
    tokenized = httpx.post(server.base_url + "/tokenize", json=body, timeout=30).json()
    assert request.prompt_token_ids == tokenized["tokens"]
    # With no limit the engine may use the rest of the context window.
    del body["max_completion_tokens"]
    httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert engine.requests[-1].sampling.max_tokens == 131072 - len(tokenized["tokens"])
