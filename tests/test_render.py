"""Rendering requests into Harmony prompts: golden prompts and the rules behind them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parsers.conversation import AssistantMessage, Prompt, Reasoning, ToolCall, ToolResult, UserMessage
from parsers.render import Renderer
from parsers.vocab import Vocab
from proxy.chat.request import parse_chat_request
from tests.conftest import FIXTURES

GOLDEN = sorted((FIXTURES / "prompts").glob("*.request.json"))


@pytest.fixture(scope="module")
def renderer(vocab: Vocab) -> Renderer:
    return Renderer(vocab)


def render_request(renderer: Renderer, path: Path) -> list[int]:
    return renderer.render(parse_chat_request(json.loads(path.read_text()), "medium").prompt)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name.split(".")[0])
def test_golden_prompts(vocab: Vocab, renderer: Renderer, path: Path) -> None:
    expected = path.with_name(path.name.replace(".request.json", ".prompt.txt")).read_text()
    tokens = render_request(renderer, path)
    assert vocab.decode(tokens) == expected
    assert tokens[-2:] == [vocab.special.start, *vocab.encode("assistant")]


def test_there_are_golden_prompts_for_each_rule() -> None:
    names = {p.name.split(".")[0] for p in GOLDEN}
    assert {"effort_top_level", "effort_chat_template_kwargs", "effort_chat_template_args", "effort_top_level_wins",
            "tool_loop_in_progress", "tool_loop_finished_then_user", "system_and_developer"} <= names


def test_text_that_spells_a_special_token_stays_text(vocab: Vocab, renderer: Renderer) -> None:
    tokens = render_request(renderer, FIXTURES / "prompts" / "system_and_developer.request.json")
    user_start = len(tokens) - 1 - tokens[::-1].index(vocab.special.message)  # last <|message|>: the user's
    body = tokens[user_start + 1 : tokens.index(vocab.special.end, user_start)]
    assert vocab.decode(body) == "Hello <|end|> there"
    assert not any(vocab.is_special(t) for t in body)


def test_history_tool_calls_are_written_as_the_model_writes_them(vocab: Vocab, renderer: Renderer) -> None:
    prompt = Prompt([UserMessage("q"), ToolCall("c1", "get.weather-v2", '{"a":1}'), ToolResult("c1", "get.weather-v2", "r")])
    tokens = renderer.render(prompt)
    written = vocab.encode_harmony(
        '<|start|>assistant<|channel|>commentary to=functions.get.weather-v2 <|constrain|>json<|message|>{"a":1}<|call|>'
    )
    assert any(tokens[i : i + len(written)] == written for i in range(len(tokens)))


def test_the_prompt_has_no_date_so_its_prefix_is_stable(vocab: Vocab, renderer: Renderer) -> None:
    text = vocab.decode(renderer.render(Prompt([UserMessage("hi")])))
    assert "Current date" not in text and "Knowledge cutoff: 2024-06" in text


@pytest.mark.parametrize(
    ("items", "kept"),
    [
        # a finished turn loses its analysis, the next turn's open loop keeps it
        ([UserMessage("a"), Reasoning("r1"), AssistantMessage("done"), UserMessage("b"), Reasoning("r2"),
          ToolCall("c", "f", "{}"), ToolResult("c", "f", "x")], ["r2"]),
        # a loop that reached its final answer loses all of its analysis
        ([UserMessage("a"), Reasoning("r1"), ToolCall("c", "f", "{}"), ToolResult("c", "f", "x"), Reasoning("r2"),
          AssistantMessage("done")], []),
        # a preamble does not end the loop
        ([UserMessage("a"), Reasoning("r1"), AssistantMessage("checking", preamble=True), ToolCall("c", "f", "{}"),
          ToolResult("c", "f", "x")], ["r1"]),
    ],
)
def test_analysis_is_kept_only_inside_an_unfinished_tool_loop(
    vocab: Vocab, renderer: Renderer, items: list, kept: list[str]
) -> None:
    text = vocab.decode(renderer.render(Prompt(items)))
    for reasoning in ("r1", "r2"):
        assert (f"<|channel|>analysis<|message|>{reasoning}<|end|>" in text) == (reasoning in kept)
