"""Properties of the output parser over generated token streams (hypothesis)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.events import Event, ItemDone, ItemStarted
from parsers.items import ItemCollector
from parsers.stream import OutputParser
from parsers.vocab import Vocab, load_vocab

VOCAB = load_vocab()  # hypothesis strategies are built at import time, before fixtures exist

SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>",
            "<|endoftext|>", "<|reserved_200017|>"]
HEADER_WORDS = ["assistant", "analysis", "commentary", "final", " to=functions.get_weather", "to=functions.a-b.c",
                " to=browser.search", " to=python", " json", " code", "json", " ", "?", "to", "assist"]
TEXT = ["hello", " world", "\n", "é", "🧪", "日本", '{"city": "SF"}', " 42", "<", "|", "end", "…"]
PIECES = [VOCAB.encode_harmony(s) for s in SPECIALS] + [VOCAB.encode(s) for s in HEADER_WORDS + TEXT]
# Emoji and CJK pieces split into single tokens, so half characters appear too.
PIECES += [[t] for piece in PIECES for t in piece if len(piece) > 1]
# The text alphabet has "<" and "|" but no ">", so it cannot spell a special token: any spelling seen leaked.

token_streams = st.lists(st.sampled_from(PIECES), max_size=60).map(lambda pieces: [t for p in pieces for t in p])


def run(vocab: Vocab, chunks: list[list[int]]) -> tuple[list[Event], int]:
    parser = OutputParser(vocab)
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return events, parser.reasoning_tokens


def folded(events: list[Event]) -> list[Any]:
    collector = ItemCollector()
    collector.add(events)
    return [(item.kind, item.name, item.text, item.complete, item.token_count) for item in collector.items]


def chunked(tokens: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(tokens) + 1) for c in cuts} | {0, len(tokens)})
    return [tokens[a:b] for a, b in pairwise(points)]


@settings(max_examples=400, deadline=None)
@given(tokens=token_streams, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_gives_the_same_items(tokens: list[int], cuts: list[int]) -> None:
    whole, reasoning_whole = run(VOCAB, [tokens])
    pieces, reasoning_pieces = run(VOCAB, chunked(tokens, cuts))
    single, reasoning_single = run(VOCAB, [[t] for t in tokens])
    assert folded(whole) == folded(pieces) == folded(single)
    assert reasoning_whole == reasoning_pieces == reasoning_single


@settings(max_examples=400, deadline=None)
@given(tokens=token_streams)
def test_no_markup_leaks_and_events_are_well_formed(tokens: list[int]) -> None:
    events, _ = run(VOCAB, [[t] for t in tokens])
    open_item, started = None, 0
    for event in events:
        if isinstance(event, ItemStarted):
            assert open_item is None and event.index == started  # one open item at a time, indexes in order
            open_item, started = event.index, started + 1
            if event.name is not None:
                assert event.name and not any(s in event.name for s in SPECIALS)
                assert not any(ch.isspace() for ch in event.name)
        elif type(event) is str:  # text of the open item
            assert open_item is not None and event
            assert not any(s in event for s in SPECIALS)
        elif isinstance(event, ItemDone):
            assert event.index == open_item
            open_item = None
    assert open_item is None  # finish() closed everything


@settings(max_examples=300, deadline=None)
@given(tokens=token_streams)
def test_joined_text_never_contains_special_token_spellings(tokens: list[int]) -> None:
    events, _ = run(VOCAB, [[t] for t in tokens])
    for _kind, name, text, _complete, _count in folded(events):
        for spelling in SPECIALS:
            assert spelling not in text
            assert name is None or spelling not in name


# -- round trip: well-formed turns in every header variant the model writes --------------------------------

message_specs = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["analysis", "commentary", "final"]), st.none(), st.text(min_size=1, max_size=30)),
        st.tuples(st.sampled_from(["commentary", "analysis"]), st.sampled_from(["get_weather", "web-search", "get.x"]),
                  st.text(min_size=0, max_size=30)),
    ),
    min_size=1,
    max_size=5,
)
variants = st.fixed_dictionaries(
    {
        "recipient_first": st.booleans(),
        "content_type": st.sampled_from(["", " <|constrain|>json", "<|constrain|>json", " json", " code"]),
        "opening": st.sampled_from(["", "<|start|>assistant", "assistant"]),
        "end": st.sampled_from(["<|end|>", "<|end|>\n"]),
    }
)


def render_turn(specs: list[tuple[str, str | None, str]], variant: dict[str, Any]) -> str:
    parts = []
    for position, (channel, name, text) in enumerate(specs):
        start = variant["opening"] if position == 0 else "<|start|>assistant"
        if name is None:
            header = f"{start}<|channel|>{channel}"
        elif variant["recipient_first"]:
            header = f"{start} to=functions.{name}<|channel|>{channel}{variant['content_type']}"
        else:
            header = f"{start}<|channel|>{channel} to=functions.{name}{variant['content_type']}"
        last = position == len(specs) - 1
        end = ("<|call|>" if name else "<|return|>") if last else variant["end"]
        parts.append(f"{header}<|message|>{text}{end}")
    return "".join(parts)


@settings(max_examples=300, deadline=None)
@given(specs=message_specs, variant=variants)
def test_well_formed_turns_round_trip(specs: list[tuple[str, str | None, str]], variant: dict[str, Any]) -> None:
    # Text made only of characters that cannot form a special token (the strategy may draw "<|", spelled out).
    specs = [(channel, name, text.replace("<|", "< |")) for channel, name, text in specs]
    tokens = VOCAB.encode_harmony(render_turn(specs, variant))
    kinds = {"analysis": "reasoning", "commentary": "preamble", "final": "final"}
    expected = [("tool_call" if name else kinds[channel], name, text, True) for channel, name, text in specs]
    for chunks in ([tokens], [[t] for t in tokens]):
        events, _ = run(VOCAB, chunks)
        collector = ItemCollector()
        collector.add(events)
        assert collector.summary() == expected


def kept_reasoning(chunks: list[list[int]]) -> list[tuple[int, ...] | None]:
    parser = OutputParser(VOCAB, keep_reasoning_tokens=True)
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return [event.tokens for event in events if isinstance(event, ItemDone) and event.tokens is not None]


@settings(max_examples=300, deadline=None)
@given(tokens=token_streams, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_kept_reasoning_tokens_are_the_bodies_as_generated(tokens: list[int], cuts: list[int]) -> None:
    """Each reasoning item's kept tokens are the ones between its <|message|> and what ended it, for any split;
    decoded they give the item's text (sealed reasoning renders back from them)."""
    whole = kept_reasoning([tokens])
    assert kept_reasoning(chunked(tokens, cuts)) == whole == kept_reasoning([[t] for t in tokens])
    events, _ = run(VOCAB, [tokens])
    reasoning = [item for item in collected(events) if item.kind.value == "reasoning"]
    assert len(reasoning) == len(whole)
    text_tokens = VOCAB.text_token_count
    for item, kept in zip(reasoning, whole):
        assert VOCAB.decode([t for t in kept if t < text_tokens]) == item.text
    analysis = VOCAB.encode_harmony("<|channel|>analysis<|message|>") + VOCAB.encode("why")
    assert kept_reasoning([analysis, VOCAB.encode_harmony("<|end|>")]) == [tuple(VOCAB.encode("why"))]


def collected(events: list[Event]) -> list[Any]:
    collector = ItemCollector()
    collector.add(events)
    return collector.items
