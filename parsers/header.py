"""Parsing one Harmony message header, in every form gpt-oss writes it.

A header is what stands between `<|start|>` and `<|message|>`: the author (`assistant`), an optional
recipient (`to=functions.get_weather`, before or after `<|channel|>`), the channel, and an optional
content type (`<|constrain|>json`, ` json`, ` code`, with or without a space). The stream parser hands us
the header split at its `<|channel|>` and `<|constrain|>` tokens; anything we cannot read is malformed,
and the parser skips that one message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

CHANNELS = frozenset({"analysis", "commentary", "final"})


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
    """Read a header from its segments; None when it is malformed."""
    channel = recipient = content_type = None
    for marker, text in segments:
        words = text.split()
        if marker is Marker.CHANNEL:
            if channel is not None or not words or words[0] not in CHANNELS:
                return None
            channel, words = words[0], words[1:]
        elif marker is Marker.CONSTRAIN:
            if content_type is not None or not words:
                return None
            content_type, words = words[0], words[1:]
        for word in words:
            if word.startswith("to=") and len(word) > 3 and recipient is None:
                recipient = word[3:]
            elif marker is Marker.NONE and word == "assistant":
                continue  # the author, written again when the model repeats <|start|>assistant
            elif marker is not Marker.NONE and content_type is None and _is_content_type(word):
                content_type = word
            else:
                return None
    if recipient == "assistant":  # addressed back to itself: an ordinary message
        recipient = None
    return Header(channel, recipient, content_type)


def could_start_header(text: str) -> bool:
    """Whether text seen with no `<|start|>` may still be the start of a header (`assistant`, `to=...`).

    The parser holds such text back until it knows: if it reads as prose, it is bare final content.
    """
    words = text.split()
    if len(words) > 2 or len(text) > 128:
        return False
    last_is_open = bool(words) and not text[-1].isspace()  # the last word may still grow
    for position, word in enumerate(words):
        if word == "assistant" or word.startswith("to="):
            continue
        growing = last_is_open and position == len(words) - 1
        if growing and ("assistant".startswith(word) or "to=".startswith(word)):
            continue
        return False
    return True


def _is_content_type(word: str) -> bool:
    return word.replace("_", "").replace("-", "").replace("/", "").replace(".", "").replace("+", "").isalnum()
