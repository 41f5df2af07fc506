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
            elif marker is not Marker.NONE and "type" not in given and _is_content_type(word):
                content_type = word
                given.add("type")
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
