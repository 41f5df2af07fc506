"""Rendering requests into Harmony prompts: golden prompts and the rules behind them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import Author, DeveloperContent, Message, RenderOptions, Role, SystemContent, ToolDescription

from parsers.conversation import AssistantMessage, Instructions, Prompt, Reasoning, ToolCall, ToolResult, UserMessage
from parsers.message_tokens import MessageWriter
from parsers.opening_messages import EFFORTS, KNOWLEDGE_CUTOFF
from parsers.render import Renderer, _visible_history, split_leading_instructions
from parsers.vocab import Vocab, load_vocab
from proxy.chat.request import parse_chat_request
from tests.conftest import FIXTURES
from tools.definitions import FunctionTool, ResponseFormat

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
    prompt = Prompt([UserMessage("q"), ToolCall("c1", "get.weather-v2", '{"a":1}'),
                     ToolResult("c1", "get.weather-v2", "r")])
    tokens = renderer.render(prompt)
    written = vocab.encode_harmony(
        "<|start|>assistant<|channel|>commentary to=functions.get.weather-v2 <|constrain|>json<|message|>"
        '{"a":1}<|call|>'
    )
    assert any(tokens[i : i + len(written)] == written for i in range(len(tokens)))


def test_a_cached_call_or_result_is_not_reused_for_another_namespace_or_form(renderer: Renderer) -> None:
    """The renderer caches each item's tokens: what tells two calls apart (namespace, freeform) is in the key."""
    items = [ToolCall("c", "x", "{}"), ToolCall("c", "x", "{}", namespace="shell"),
             ToolCall("c", "x", "{}", freeform=True), ToolResult("c", "x", "r"),
             ToolResult("c", "x", "r", namespace="shell")]
    for item in items:
        renderer.render(Prompt([UserMessage("q"), item]))  # fills the cache with each one's tokens
    for item in items:
        assert renderer.render(Prompt([UserMessage("q"), item])) == Renderer(VOCAB).render(
            Prompt([UserMessage("q"), item]))


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


# -- our message rendering is openai-harmony's, token for token --------------------------------------------

VOCAB = load_vocab()
RENDERER = Renderer(VOCAB)
MESSAGES = MessageWriter(VOCAB)


def library_render(prompt: Prompt) -> list[int]:
    """The same conversation rendered by openai-harmony message by message (tool calls in the model's form)."""
    encoding = VOCAB.encoding
    options = RenderOptions(conversation_has_function_tools=bool(prompt.tools))
    system = SystemContent.new().with_reasoning_effort(EFFORTS[prompt.reasoning_effort]).with_knowledge_cutoff(
        KNOWLEDGE_CUTOFF)
    tokens = encoding.render(Message.from_role_and_content(Role.SYSTEM, system), options)
    leading, rest = split_leading_instructions(prompt.items)
    instructions = "\n\n".join(item.text for item in leading if item.text)
    if instructions or prompt.tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if prompt.tools:
            developer = developer.with_function_tools(
                [ToolDescription.new(t.name, t.description, t.parameters) for t in prompt.tools])
        tokens += encoding.render(Message.from_role_and_content(Role.DEVELOPER, developer), options)
    for item in _visible_history(rest):
        if isinstance(item, ToolCall):
            tokens += MESSAGES.item(item)
            continue
        if isinstance(item, UserMessage):
            message = Message.from_role_and_content(Role.USER, item.text)
        elif isinstance(item, Reasoning):
            message = Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel("analysis")
        elif isinstance(item, AssistantMessage):
            message = Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel(
                "commentary" if item.preamble else "final")
        elif isinstance(item, ToolResult):
            message = Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{item.name}"), item.output
                                                      ).with_channel("commentary").with_recipient("assistant")
        else:
            message = Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(item.text))
        tokens += encoding.render(message, options)
    return tokens + VOCAB.encode_harmony("<|start|>assistant")


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
names = st.sampled_from(["get_weather", "web-search", "get.x"])
items = st.lists(st.one_of(
    st.builds(UserMessage, texts), st.builds(Reasoning, texts), st.builds(AssistantMessage, texts, st.booleans()),
    st.builds(ToolCall, st.just("c1"), names, texts), st.builds(ToolResult, st.just("c1"), names, texts),
    st.builds(Instructions, texts.filter(bool)),
), max_size=8)
# Schemas openai-harmony renders without loss (tests/test_tool_declarations.py covers many more).
lossless_schemas = [
    None, {}, {"type": "object"},
    {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}},
    {"type": "object", "description": "Where", "required": ["days"], "properties": {
        "days": {"type": "integer", "default": 3, "title": "Days"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c", "nullable": True},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": ["string", "null"]}}}},
        "when": {"oneOf": [{"type": "string", "description": "ISO date"}, {"type": "number"}], "default": "now"}}},
]
tool_lists = st.lists(st.builds(FunctionTool, names, texts, st.sampled_from(lossless_schemas)),
                      max_size=2, unique_by=lambda tool: tool.name)


@settings(max_examples=300, deadline=None)
@given(leading=st.lists(st.builds(Instructions, texts.filter(bool)), max_size=2), items=items, tools=tool_lists,
       effort=st.sampled_from(["low", "medium", "high"]))
def test_rendering_matches_openai_harmony_token_for_token(leading: list, items: list, tools: list, effort: str) -> None:
    prompt = Prompt(leading + items, tools, effort)
    assert RENDERER.render(prompt) == library_render(prompt)


def test_long_unbroken_runs_render_in_linear_time(vocab: Vocab, renderer: Renderer) -> None:
    started = time.perf_counter()
    tokens = renderer.render(Prompt([UserMessage("x" * 1_000_000), ToolResult("c", "f", "A" * 500_000)]))
    assert time.perf_counter() - started < 5  # openai-harmony alone takes minutes (quadratic BPE)
    assert vocab.decode(tokens).count("x") == 1_000_000


# -- the developer message: sections in Harmony's order, each only with content -------------------------------

SCHEMA = {"type": "object", "properties": {"value": {"type": "integer"}}}


def test_a_response_format_alone_has_no_instructions_heading(vocab: Vocab, renderer: Renderer) -> None:
    text = vocab.decode(renderer.render(Prompt([UserMessage("q")], response_format=ResponseFormat(
        "answer", SCHEMA, "The answer."))))
    assert ('<|start|>developer<|message|># Response Formats\n\n## answer\n\n// The answer.\n'
            '{"type":"object","properties":{"value":{"type":"integer"}}}<|end|>') in text
    assert "# Instructions" not in text


def test_the_response_format_ends_the_developer_message(vocab: Vocab, renderer: Renderer) -> None:
    prompt = Prompt([Instructions("Be brief."), UserMessage("q")], [FunctionTool("f", "F.", None)],
                    response_format=ResponseFormat("answer", SCHEMA))
    text = vocab.decode(renderer.render(prompt))
    assert ("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
            "namespace functions {\n\n// F.\ntype f = () => any;\n\n} // namespace functions\n\n"
            "# Response Formats\n\n## answer\n\n" + json.dumps(SCHEMA, separators=(",", ":")) + "<|end|>") in text


@settings(max_examples=300, deadline=None)
@given(leading=st.lists(st.builds(Instructions, texts), max_size=2), tools=tool_lists,
       response_format=st.none() | st.builds(ResponseFormat, st.sampled_from(["answer", "x"]),
                                             st.sampled_from([SCHEMA, {}]), texts))
def test_the_developer_message_is_encoded_as_one_text(leading: list, tools: list, response_format: Any) -> None:
    """Its pieces are cached apart; together they are the tokens of the whole text, whose tool part is
    openai-harmony's (these schemas lose nothing there) and whose response format comes last."""
    prompt = Prompt([*leading, UserMessage("q")], tools, "medium", response_format)
    instructions = "\n\n".join(item.text for item in leading if item.text)
    developer = DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions(instructions)
    if tools:
        developer = developer.with_function_tools(
            [ToolDescription.new(t.name, t.description, t.parameters) for t in tools])
    text = VOCAB.decode(VOCAB.encoding.render(Message.from_role_and_content(Role.DEVELOPER, developer)))
    text = text.removeprefix("<|start|>developer<|message|>").removesuffix("<|end|>")
    if response_format is not None:
        description = f"// {response_format.description}\n" if response_format.description else ""
        text += ("\n\n" if text else "") + (f"# Response Formats\n\n## {response_format.name}\n\n{description}"
                                           + json.dumps(response_format.schema, separators=(",", ":")))
    tokens = RENDERER.render(prompt)
    start = tokens.index(VOCAB.special.end) + 1
    user = len(tokens) - 1 - tokens[::-1].index(VOCAB.special.start, 2)
    expected = [*VOCAB.encode_harmony("<|start|>developer<|message|>"), *VOCAB.encode(text), VOCAB.special.end]
    assert tokens[start:user] == (expected if text else [])
