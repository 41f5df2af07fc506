"""Parsing one Harmony message header, in every form gpt-oss writes it.

A header is what stands between `<|start|>` and `<|message|>`: the author (`assistant`), an optional
recipient (`to=functions.get_weather`, before or after `<|channel|>`), the channel, and an optional
content type (`<|constrain|>json`, ` json`, ` code`, with or without a space). The stream parser hands us
the header split at its `<|channel|>` and `<|constrain|>` tokens; anything we cannot read is malformed,
and the parser skips that one message.

gpt-oss sometimes writes `<|channel|>` twice in one header (`<|channel|>commentary to=assistant<|channel|>analysis`,
`<|channel|>commentary to=functions.f<|channel|>commentary json`): the later channel decides, and the words
around both still count. openai-harmony keeps the first channel and folds the rest into the recipient
(`assistant<|channel|>analysis`, `functions.f<|channel|>commentary`), which servers built on it then report as a
tool name or an unknown tool; skipping the message would lose what the model wrote.

A message closed without its `<|message|>` (missing, or replaced by a stray token: `<|channel|>final*)__Hello!<|end|>`,
`<|channel|>commentary Hello<|end|>`) still says what the model meant: the header is what can be recognised
(the channel, then any `to=` and `json`/`code`), the rest is the message (`split_unmarked_message`).
A bare channel name before `<|channel|>` (`final<|channel|>final<|message|>`) is header debris, not text.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

CHANNELS = frozenset({"analysis", "commentary", "final"})

# The recognisable start of a header whose <|message|> never came: channel, recipients, a known content type.
_UNMARKED_HEADER = re.compile(r"\s*(?:analysis|commentary|final)(?:\s+to=\S+)*(?:\s+(?:json|code)(?!\S))?\s*")


class Marker(enum.Enum):
    """Which special token opened a header segment (NONE: the text right after `<|start|>`)."""

    NONE = 0
    CHANNEL = 1
    CONSTRAIN = 2


@dataclass(frozen=True)
class Header:
    channel: str | None
    recipient: str | None
    content_type: str | None


def parse_header(segments: list[tuple[Marker, str]]) -> Header | None:
    """Read a header from its segments; None when it is malformed.

    Each field is given at most once, except that a repeated `<|channel|>` restates the header: from there on the
    channel, recipient and content type may each be given again, and the later value wins.
    """
    channel = recipient = content_type = None
    given: set[str] = set()  # the fields given since the header began or was restated
    for marker, text in segments:
        words = text.split()
        if marker is Marker.CHANNEL:
            if not words or words[0] not in CHANNELS:
                return None
            if channel is not None:
                given.clear()
            channel, words = words[0], words[1:]
        elif marker is Marker.CONSTRAIN:
            if "type" in given or not words:
                return None
            content_type, words = words[0], words[1:]
            given.add("type")
        for word in words:
            if word.startswith("to=") and len(word) > 3 and "to" not in given:
                recipient = word[3:]
                given.add("to")
            elif marker is Marker.NONE and word == "assistant":
                continue  # the author, written again when the model repeats <|start|>assistant
            elif marker is Marker.NONE and word in CHANNELS and channel is None:
                channel = word  # a channel name with no <|channel|> before it; a later <|channel|> decides
            elif marker is not Marker.NONE and "type" not in given and _is_content_type(word):
                content_type = word
                given.add("type")
            else:
                return None
    if recipient == "assistant":  # addressed back to itself: an ordinary message
        recipient = None
    return Header(channel, recipient, content_type)


def split_unmarked_message(segments: list[tuple[Marker, str]]) -> tuple[Header, int] | None:
    """A message that ended before any `<|message|>`: its header, and where the message begins in the last
    segment's text. None when the last segment does not begin with a channel name, or the header is malformed.
    """
    marker, text = segments[-1]
    match = _UNMARKED_HEADER.match(text) if marker is Marker.CHANNEL else None
    if match is None:
        return None
    header = parse_header([*segments[:-1], (marker, match.group())])
    return None if header is None else (header, match.end())


_HEADER_WORDS = ("assistant", "to=", *sorted(CHANNELS))


def could_start_header(text: str) -> bool:
    """Whether text seen with no `<|start|>` may still be the start of a header (`assistant`, `to=...`, or a
    channel name written before `<|channel|>`).

    The parser holds such text back until it knows: if it reads as prose, it is bare final content.
    """
    words = text.split()
    if len(words) > 2 or len(text) > 128:
        return False
    last_is_open = bool(words) and not text[-1].isspace()  # the last word may still grow
    for position, word in enumerate(words):
        if word == "assistant" or word.startswith("to=") or word in CHANNELS:
            continue
        growing = last_is_open and position == len(words) - 1
        if growing and any(header_word.startswith(word) for header_word in _HEADER_WORDS):
            continue
        return False
    return True


def is_header_fragment(text: str) -> bool:
    """Held text that a boundary ended: dropped when it is a header fragment (`assistant`, `to=...`); a lone
    channel name followed by no `<|channel|>` is what the model said."""
    return could_start_header(text + " ") and not any(word in CHANNELS for word in text.split())


def _is_content_type(word: str) -> bool:
    return word.replace("_", "").replace("-", "").replace("/", "").replace(".", "").replace("+", "").isalnum()
