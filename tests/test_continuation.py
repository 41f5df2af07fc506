"""Incremental prompts (parsers/continuation.py): extending the last turn's tokens with the new items rendered
alone gives, token for token, what a full render of the whole conversation gives."""

from __future__ import annotations

import asyncio
import random

import pytest

from parsers.continuation import extend, first
from parsers.conversation import (
    AssistantMessage,
    Instructions,
    Item,
    Prompt,
    Reasoning,
    ToolCall,
    ToolResult,
    UserMessage,
)
from parsers.render import Renderer
from parsers.vocab import Vocab
from tools.definitions import FunctionTool, ResponseFormat

TOOLS = [FunctionTool("get_weather", "Weather.", {"type": "object", "properties": {"city": {"type": "string"}}})]


def _turn(rng: random.Random, number: int) -> list[Item]:
    """What one turn adds: the model's output (reasoning, a preamble, a call or a final answer) and the client's
    next input (a tool result, sometimes a user message)."""
    items: list[Item] = []
    if rng.random() < 0.8:
        items.append(Reasoning(f"thinking {number} " * rng.randint(1, 4)))
    kind = rng.random()
    if kind < 0.55:
        if rng.random() < 0.3:
            items.append(AssistantMessage(f"Checking {number}.", preamble=True))
        if rng.random() < 0.25:  # a custom tool's freeform call, in a namespace of the client's
            items.append(ToolCall(f"call_{number}", "apply_patch", f"*** Begin Patch {number}", "codex", True))
            items.append(ToolResult(f"call_{number}", "apply_patch", "Done.", "codex"))
        else:
            items.append(ToolCall(f"call_{number}", "get_weather", f'{{"city": "c{number}"}}'))
            items.append(ToolResult(f"call_{number}", "get_weather", f"sunny {number}"))
    else:
        items.append(AssistantMessage(f"Answer {number}."))
    if rng.random() < 0.35:
        items.append(UserMessage(f"And now {number}?"))
    if rng.random() < 0.05:
        items.append(Instructions(f"Later instruction {number}."))
    return items


@pytest.mark.parametrize("seed", range(12))
def test_every_turn_extended_is_a_full_render(vocab: Vocab, seed: int) -> None:
    rng = random.Random(seed)
    renderer = Renderer(vocab, cache_tokens=rng.choice([0, 1_000_000]))  # with and without the piece cache
    conversation: list[Item] = [Instructions("Be brief."), UserMessage("Weather in Paris?")]
    response_format = ResponseFormat("answer", {"type": "object"}) if seed % 3 == 0 else None

    def prompt() -> Prompt:
        return Prompt(list(conversation), TOOLS if seed % 2 else [], ["low", "high"][seed % 2], response_format)

    async def run() -> int:
        rendered = await first(renderer, prompt(), renderer.render(prompt()))
        extended = 0
        for number in range(30):
            conversation.extend(_turn(rng, number))
            full = renderer.render(prompt())
            following = await extend(renderer, rendered, prompt())
            assert following is not None
            assert following.tokens == full, f"turn {number}"
            rendered, extended = following, extended + 1
        return extended

    assert asyncio.run(run()) == 30


def test_other_instructions_or_tools_are_not_extended(vocab: Vocab) -> None:
    renderer = Renderer(vocab)
    items: list[Item] = [Instructions("Be brief."), UserMessage("Hi")]

    async def run() -> None:
        base = Prompt(list(items), TOOLS)
        rendered = await first(renderer, base, renderer.render(base))
        more = [*items, AssistantMessage("Hello."), UserMessage("Again")]
        assert await extend(renderer, rendered, Prompt([Instructions("Be long."), *more[1:]], TOOLS)) is None
        assert await extend(renderer, rendered, Prompt(more, [])) is None
        assert await extend(renderer, rendered, Prompt(more, TOOLS, "high")) is None
        same = await extend(renderer, rendered, Prompt(more, TOOLS))
        assert same is not None and same.tokens == renderer.render(Prompt(more, TOOLS))

    asyncio.run(run())
