"""The output parser against real gpt-oss outputs and every edge case, at the Chat Completions level."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from parsers.events import ItemDone, ItemKind, ItemStarted
from parsers.items import ItemCollector
from parsers.stream import OutputParser
from parsers.vocab import Vocab
from proxy.chat.response import ChatTurn


def generated(vocab: Vocab, completion: str) -> list[int]:
    """The tokens an engine streams for this completion: it stops at the first stop token."""
    tokens = vocab.encode_harmony(completion)
    stop = next((i for i, t in enumerate(tokens) if t in vocab.stop_token_ids), len(tokens) - 1)
    return tokens[: stop + 1]


def answer(vocab: Vocab, tokens: list[int], chunks: list[list[int]]) -> dict[str, Any]:
    """The Chat Completions answer built from `chunks` of the completion's tokens."""
    parser = OutputParser(vocab)
    numbers = itertools.count()
    turn = ChatTurn("reasoning", True, (), lambda: f"call_{next(numbers)}")
    for chunk in chunks:
        turn.add(parser.feed(chunk))
    turn.add(parser.finish())
    turn.close()
    message = turn.message()
    finish = "stop" if tokens and tokens[-1] in vocab.stop_token_ids else "length"
    return {
        "reasoning": message["reasoning"],
        "content": message["content"],
        "tool_calls": [
            {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
            for call in message.get("tool_calls", [])
        ],
        "finish_reason": turn.finish_reason(finish),
    }


def splits(tokens: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    chunks, position = [], 0
    while position < len(tokens):
        size = rng.randint(1, 7)
        chunks.append(tokens[position : position + size])
        position += size
    return chunks


def test_every_recorded_completion_gives_its_expected_answer(vocab: Vocab, recorded: list[dict[str, Any]]) -> None:
    assert len(recorded) >= 40
    for entry in recorded:
        tokens = generated(vocab, entry["completion"])
        assert answer(vocab, tokens, [tokens]) == entry["expected"], entry["name"]


@pytest.mark.parametrize("seed", range(5))
def test_recorded_completions_give_the_same_answer_for_any_split(
    vocab: Vocab, recorded: list[dict[str, Any]], seed: int
) -> None:
    for entry in recorded:
        tokens = generated(vocab, entry["completion"])
        one_by_one = [[token] for token in tokens]
        assert answer(vocab, tokens, one_by_one) == entry["expected"], entry["name"]
        assert answer(vocab, tokens, splits(tokens, seed)) == entry["expected"], entry["name"]


def test_no_special_token_text_reaches_any_field(vocab: Vocab, recorded: list[dict[str, Any]]) -> None:
    spellings = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>")
    for entry in recorded:
        tokens = generated(vocab, entry["completion"])
        result = answer(vocab, tokens, [[t] for t in tokens])
        fields = [result["reasoning"] or "", result["content"] or ""]
        fields += [call["name"] + call["arguments"] for call in result["tool_calls"]]
        for text in fields:
            assert not any(spelling in text for spelling in spellings), entry["name"]
        for call in result["tool_calls"]:
            assert call["name"] and " " not in call["name"] and "assistant" not in call["name"]


def collect(vocab: Vocab, text: str) -> list[tuple[str, str | None, str, bool]]:
    parser = OutputParser(vocab)
    collector = ItemCollector()
    for token in vocab.encode_harmony(text):
        collector.add(parser.feed([token]))
    collector.add(parser.finish())
    return collector.summary()


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # recipient before <|channel|>, after it, and with every content type spelling
        ("<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
         [("tool_call", "f", "{}", True)]),
        ("<|channel|>commentary to=functions.f<|constrain|>json<|message|>{}<|call|>",
         [("tool_call", "f", "{}", True)]),
        ("<|channel|>commentary to=functions.f json<|message|>{}<|call|>", [("tool_call", "f", "{}", True)]),
        ("<|channel|>commentary to=functions.f code<|message|>{}<|call|>", [("tool_call", "f", "{}", True)]),
        ("<|channel|>commentary to=functions.f<|message|>{}<|call|>", [("tool_call", "f", "{}", True)]),
        # tool call on the analysis channel
        ("<|channel|>analysis to=functions.f code<|message|>{\"a\":1}<|call|>", [("tool_call", "f", '{"a":1}', True)]),
        # repeated and missing <|start|>assistant
        ("<|start|>assistant<|start|>assistant<|channel|>final<|message|>x<|return|>", [("final", None, "x", True)]),
        ("<|channel|>analysis<|message|>a<|end|><|channel|>final<|message|>b<|return|>",
         [("reasoning", None, "a", True), ("final", None, "b", True)]),
        ("<|channel|>analysis<|message|>a<|end|>assistant<|channel|>final<|message|>b<|return|>",
         [("reasoning", None, "a", True), ("final", None, "b", True)]),
        # implicit end by <|start|> or <|channel|>
        ("<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b<|return|>",
         [("reasoning", None, "a", True), ("final", None, "b", True)]),
        # no channel at all
        ("<|message|>plain<|return|>", [("final", None, "plain", True)]),
        ("<|start|>assistant<|message|>plain<|return|>", [("final", None, "plain", True)]),
        # malformed header: that message only is skipped
        ("<|channel|>commentary?<|message|>junk<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
         [("final", None, "ok", True)]),
        ("<|channel|>final we think so<|message|>junk<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
         [("final", None, "ok", True)]),
        # a hallucinated message from another author is skipped, not shown
        ("<|start|>functions.f to=assistant<|channel|>commentary<|message|>fake result<|end|>", []),
        ("<|start|>user<|message|>fake user<|end|>", []),
        # cut off in a header, a body, arguments
        ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>fin", [("reasoning", None, "a", True)]),
        ("<|channel|>final<|message|>half", [("final", None, "half", False)]),
        ("<|channel|>commentary to=functions.f json<|message|>{\"a\":", [("tool_call", "f", '{"a":', False)]),
        # undeclared namespaces never leak and never map onto a user tool's short name
        ("<|channel|>commentary to=browser.search json<|message|>{\"query\":\"x\"}<|call|>", []),
        ("<|channel|>analysis to=python code<|message|>print(1)<|call|>", []),
        ("<|channel|>commentary to=container.exec json<|message|>{}<|call|>", []),
        ("<|channel|>commentary to=functions<|message|>{}<|call|>", []),
        # addressed to itself: an ordinary message
        ("<|channel|>final to=assistant<|message|>hi<|return|>", [("final", None, "hi", True)]),
        # bare text, whole or held back while it may still be a header
        ("Hello!", [("final", None, "Hello!", False)]),
        ("to<|return|>", [("final", None, "to", True)]),
        ("assistant<|channel|>final<|message|>x<|return|>", [("final", None, "x", True)]),
        (" to=functions.f<|channel|>commentary json<|message|>{}<|call|>", [("tool_call", "f", "{}", True)]),
        ("assistant", []),
        ("\n\n<|channel|>final<|message|>x<|return|>", [("final", None, "x", True)]),
        # a message closed before its <|message|> came (missing, or a stray token in its place): the header is what
        # can be recognised, the rest is the message (issue 16)
        ("<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final*)__Hello!<|return|>",
         [("reasoning", None, "User says hi.", True), ("final", None, "*)__Hello!", True)]),
        ("<|channel|>commentary Hello<|end|>", [("preamble", None, "Hello", True)]),
        ("<|channel|>commentary to=functions.f json {\"a\":1}<|call|>", [("tool_call", "f", '{"a":1}', True)]),
        # ... but a header a new <|start|> interrupts was abandoned (see aldehir_unterminated_header_then_start)
        ("<|channel|>final Hi<|start|>assistant<|channel|>final<|message|>x<|return|>", [("final", None, "x", True)]),
        ("<|channel|>final<|end|>", []),
        ("<|channel|>commentary ...?<|end|>", []),  # punctuation alone: constrained-decoding debris
        ("<|channel|>commentary to=functions.f {}<|call|>", [("tool_call", "f", "{}", True)]),
        ("<|channel|>commentary to=functions.f<|constrain|>json<|call|>", []),
        # cut off after a header whose <|message|> never came: read as a message closed there, as an end token would
        ("<|channel|>final Hello", [("final", None, "Hello", False)]),
        ("<|channel|>final", []),  # cut off within the header: half-written, dropped
        ("<|channel|>commentary to=functions.f", []),
        # a bare channel name right before <|channel|> is header debris; before an end it is what the model said
        (("<|channel|>analysis<|message|>a<|end|>commentary<|channel|>commentary to=functions.get_weather json"
          "<|message|>{}<|call|>"), [("reasoning", None, "a", True), ("tool_call", "get_weather", "{}", True)]),
        ("<|channel|>analysis<|message|>a<|end|>final<|channel|>final<|message|>Hi<|return|>",
         [("reasoning", None, "a", True), ("final", None, "Hi", True)]),
        ("<|channel|>analysis<|message|>a<|end|>final<|return|>",
         [("reasoning", None, "a", True), ("final", None, "final", True)]),
        ("final answer<|return|>", [("final", None, "final answer", True)]),
        ("analysis<|message|>thinking<|end|>", [("reasoning", None, "thinking", True)]),
        # special tokens inside a body are dropped, the body goes on
        ("<|channel|>final<|message|>a<|message|>b<|constrain|>c<|endoftext|>d<|return|>",
         [("final", None, "abcd", True)]),
    ],
)
def test_edge_cases(vocab: Vocab, completion: str, expected: list[tuple[str, str | None, str, bool]]) -> None:
    assert collect(vocab, completion) == expected


def test_a_header_too_long_to_be_one_skips_its_message(vocab: Vocab) -> None:
    junk = "word " * 400
    text = (f"<|channel|>comment {junk}<|channel|>x<|message|>secret<|end|><|start|>assistant<|channel|>final"
            "<|message|>ok")
    assert collect(vocab, text) == [("final", None, "ok", False)]


def test_a_long_message_after_a_stray_token_is_kept_whole(vocab: Vocab) -> None:
    # Past MAX_HEADER_BYTES the header cannot be buffered any longer: its recognisable part decides, and the text
    # goes on streaming as that message's.
    answer = "".join(f"line {n} of the answer.\n" for n in range(200))
    text = f"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final*)__{answer}<|return|>"
    assert collect(vocab, text) == [("reasoning", None, "a", True), ("final", None, f"*)__{answer}", True)]
    tokens = vocab.encode_harmony(text)
    for chunks in ([tokens], splits(tokens, 3)):
        parser = OutputParser(vocab)
        collector = ItemCollector()
        for chunk in chunks:
            collector.add(parser.feed(chunk))
        collector.add(parser.finish())
        assert collector.summary() == collect(vocab, text)
        assert 0 < collector.items[1].token_count <= len(vocab.encode(f"*)__{answer}"))


def test_split_multibyte_characters_decode_across_steps(vocab: Vocab) -> None:
    text = "🇫🇷🧪 日本語"
    tokens = vocab.encode_harmony(f"<|channel|>final<|message|>{text}<|return|>")
    assert any(vocab.token_text[t] is None for t in tokens if t < vocab.text_token_count)  # really split
    for chunks in ([tokens], [[t] for t in tokens]):
        parser = OutputParser(vocab)
        collector = ItemCollector()
        for chunk in chunks:
            collector.add(parser.feed(chunk))
        assert collector.summary() == [("final", None, text, True)]


def test_a_character_cut_in_half_by_the_end_becomes_a_replacement_character(vocab: Vocab) -> None:
    tokens = vocab.encode_harmony("<|channel|>final<|message|>ok 🧪")
    partial = [t for t in tokens if t < vocab.text_token_count and vocab.token_text[t] is None]
    parser = OutputParser(vocab)
    collector = ItemCollector()
    collector.add(parser.feed(tokens[: tokens.index(partial[0]) + 1]))
    collector.add(parser.finish())
    assert collector.summary() == [("final", None, "ok \ufffd", False)]


def test_events_report_indexes_kinds_and_token_counts(vocab: Vocab) -> None:
    tokens = vocab.encode_harmony(
        "<|channel|>analysis<|message|>one two<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"SF"}<|call|>'
    )
    parser = OutputParser(vocab)
    events = parser.feed(tokens) + parser.finish()
    reasoning_tokens = len(vocab.encode("one two"))
    assert events == [
        ItemStarted(0, ItemKind.REASONING),
        "one two",
        ItemDone(0, True, reasoning_tokens),
        ItemStarted(1, ItemKind.TOOL_CALL, "get_weather"),
        '{"city":"SF"}',
        ItemDone(1, True, len(vocab.encode('{"city":"SF"}'))),
    ]
    assert parser.reasoning_tokens == reasoning_tokens


def test_token_ids_outside_the_vocabulary_are_ignored(vocab: Vocab) -> None:
    parser = OutputParser(vocab)
    tokens = vocab.encode_harmony("<|channel|>final<|message|>ok")
    collector = ItemCollector()
    collector.add(parser.feed([*tokens, 10_000_000, -1 + 2**31]))
    collector.add(parser.finish())
    assert collector.summary() == [("final", None, "ok", False)]
