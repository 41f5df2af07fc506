"""Stop strings over streamed answer text: the same cut for any split, nothing shown that is then taken back."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.stop_strings import StopMatcher


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    shown = "".join(matcher.feed(piece) for piece in pieces)
    if not matcher.hit:
        shown += matcher.flush()
    return shown, matcher.hit


def test_text_before_the_stop_string_is_kept() -> None:
    assert run(("END",), ["one two E", "N", "D three"]) == ("one two ", True)
    assert run(("END", "two"), ["one two END"]) == ("one ", True)
    assert run(("E", "DED"), ["DED"]) == run(("E", "DED"), ["DE", "D"]) == ("D", True)  # "E" is complete first
    assert run(("END",), ["no stop here"]) == ("no stop here", False)
    assert run((), ["anything END"]) == ("anything END", False)


def test_a_possible_start_of_a_stop_string_is_held_back_then_released() -> None:
    matcher = StopMatcher(("STOP",))
    assert matcher.feed("go ST") == "go "
    assert matcher.feed("ill") == "STill"
    assert matcher.feed("ST") == ""
    assert matcher.flush() == "ST"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abcEND \n", max_size=60),
    stops=st.lists(st.text(alphabet="abcEND", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8),
)
def test_any_split_gives_what_one_piece_gives(text: str, stops: list[str], cuts: list[int]) -> None:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in pairwise(points)]
    # As text is generated character by character: the first stop string to be complete ends it.
    expected = (text, False)
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            expected = (text[: end - max(map(len, ending))], True)
            break
    assert run(tuple(stops), pieces) == expected


def test_a_held_back_message_still_gets_its_separator() -> None:
    from parsers.events import ItemDone, ItemKind, ItemStarted
    from proxy.chat.response import ChatTurn

    for stops in ((), ("abz",), ("b\n\nx",)):
        turn = ChatTurn("reasoning_content", True, stops, lambda: "call_1")
        events = [ItemStarted(0, ItemKind.PREAMBLE), "ab", ItemDone(0, True, 1),
                  ItemStarted(1, ItemKind.FINAL), "d", ItemDone(1, True, 1)]
        deltas = turn.add(events) + turn.close()
        streamed = "".join(delta[1] for delta in deltas if type(delta) is tuple and delta[0] == "content")
        assert streamed == turn.message()["content"] == "ab\n\nd", stops
