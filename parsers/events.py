"""What the output parser reports: items start, grow by text, and end.

An item is one Harmony message the client should see: reasoning (analysis), a message (final answer or a
commentary preamble), a function tool call, or a call to a tool the server runs itself (a namespace the parser was
given: an MCP server's, or gpt-oss's built-in `browser` and `python`). Indexes count emitted items from 0 in order.

Items never overlap: one starts only after the previous one is done. So a text delta needs no index, and is
simply a `str` that belongs to the item started last. That keeps the hot path free of allocations: the text of
most tokens is a string the vocabulary table already holds.
"""

from __future__ import annotations

import enum


class ItemKind(enum.Enum):
    REASONING = "reasoning"  # analysis channel
    FINAL = "final"  # the answer
    PREAMBLE = "preamble"  # commentary with no recipient: user-visible text before tool calls
    TOOL_CALL = "tool_call"  # addressed to functions.NAME or a client namespace's NS.NAME; the text is the arguments
    SERVER_CALL = "server_call"  # addressed to a server-side tool (name: the whole recipient); the text is its input


class ItemStarted:
    __slots__ = ("channel", "index", "kind", "name", "namespace")

    def __init__(self, index: int, kind: ItemKind, name: str | None = None, channel: str | None = None,
                 namespace: str | None = None) -> None:
        self.index = index
        self.kind = kind
        self.name = name  # the function name, for tool calls; the recipient, for server calls
        self.channel = channel  # the channel of a server call (its result is written back on it); else None
        self.namespace = namespace  # a tool call's namespace, when it is not `functions` (the client's namespace tools)

    def __repr__(self) -> str:
        channel = f", {self.channel!r}" if self.channel is not None else ""
        namespace = f", namespace={self.namespace!r}" if self.namespace is not None else ""
        return f"ItemStarted({self.index}, {self.kind.name}, {self.name!r}{channel}{namespace})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemStarted) and (self.index, self.kind, self.name, self.channel,
                                                   self.namespace) == (
            other.index,
            other.kind,
            other.name,
            other.channel,
            other.namespace,
        )


class ItemDone:
    __slots__ = ("complete", "index", "token_count", "tokens")

    def __init__(self, index: int, complete: bool, token_count: int,
                 tokens: tuple[int, ...] | None = None) -> None:
        self.index = index
        self.complete = complete  # False when the output was cut off inside the item
        self.token_count = token_count  # body tokens of the item
        # The body's token ids exactly as generated, for reasoning when the parser was asked to keep them (a
        # sealed reasoning item renders back from them); not compared: they restate the text.
        self.tokens = tokens

    def __repr__(self) -> str:
        return f"ItemDone({self.index}, complete={self.complete}, tokens={self.token_count})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemDone) and (self.index, self.complete, self.token_count) == (
            other.index,
            other.complete,
            other.token_count,
        )


Event = ItemStarted | str | ItemDone  # a str is text of the item started last
