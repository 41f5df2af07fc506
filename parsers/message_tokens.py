"""One conversation item as Harmony prompt tokens, a message of its own.

Messages that carry client text are written here, in exactly openai-harmony's form (tests/test_render.py compares
them token for token), with `Vocab.encode`: the library's tokenizer is quadratic on long unbroken runs and costs
~100 us per message, while `Vocab.encode` stays linear. History tool calls are written the way the model writes
them, `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`: the
library writes `<|start|>assistant to=functions.NAME<|channel|>commentary`, a form linked to the model putting
later calls on the analysis channel.
"""

from __future__ import annotations

import re
from array import array

from parsers.conversation import (
    AssistantMessage,
    Item,
    Reasoning,
    ServerToolCall,
    ServerToolResult,
    ToolCall,
    ToolResult,
    UserMessage,
)
from parsers.vocab import Vocab

# openai-harmony's tokenizer holds the GIL for a whole call (~1 us per token), so a long text is encoded in
# pieces, each ending where the tokenizer's pre-tokenizer must end a token anyway: at a space between ASCII
# letters (" word" is one pre-token, the word before it ends there), or after a newline followed by an ASCII
# letter (no pre-token spans a newline into a letter). The tokens are the same; between pieces another thread
# (the event loop) can take the GIL.
_PIECE_CHARS = 8192
_CUT = re.compile(r"(?<=[A-Za-z])(?= [A-Za-z])|(?<=\n)(?=[A-Za-z])")


class MessageWriter:
    """Writes items as messages, and text in pieces (`encode`), with one vocabulary's special tokens."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        special = vocab.special
        self._start, self.end, self._message = special.start, special.end, special.message
        self._channel, self._call, self._constrain = special.channel, special.call, special.constrain
        self.open_assistant = (special.start, *vocab.encode("assistant"))
        self.developer_header = (special.start, *vocab.encode("developer"), special.message)
        self._call_header_end = [special.constrain, *vocab.encode("json"), special.message]
        self._analysis_header = (*self.open_assistant, special.channel, *vocab.encode("analysis"), special.message)

    def item(self, item: Item) -> list[int]:
        if isinstance(item, UserMessage):
            return self._text_message("user", None, item.text)
        if isinstance(item, Reasoning):
            if item.tokens is not None:
                return [*self._analysis_header, *item.tokens, self.end]
            return self._text_message("assistant", "analysis", item.text)
        if isinstance(item, AssistantMessage):
            return self._text_message("assistant", "commentary" if item.preamble else "final", item.text)
        if isinstance(item, ToolCall):
            return self._tool_call(item)
        if isinstance(item, ToolResult):
            return self._text_message(f"{item.recipient} to=assistant", "commentary", item.output)
        if isinstance(item, ServerToolCall):
            return self._server_call(item)
        if isinstance(item, ServerToolResult):
            return self._text_message(f"{item.recipient} to=assistant", item.channel, item.output)
        return self._text_message("developer", None, "# Instructions\n\n" + item.text)  # Instructions

    def encode(self, text: str) -> list[int]:
        return encode_in_pieces(self._vocab, text, _PIECE_CHARS)

    def _text_message(self, header: str, channel: str | None, text: str) -> list[int]:
        encode = self._vocab.encode
        tokens = [self._start, *encode(header)]
        if channel is not None:
            tokens += [self._channel, *encode(channel)]
        return tokens + [self._message, *self.encode(text), self.end]

    def _tool_call(self, call: ToolCall) -> list[int]:
        encode = self._vocab.encode
        return [
            *self.open_assistant,
            self._channel,
            *(encode(f"commentary to={call.recipient}") + [self._message] if call.freeform else
              [*encode(f"commentary to={call.recipient} "), *self._call_header_end]),
            *self.encode(call.arguments),
            self._call,
        ]

    def _server_call(self, call: ServerToolCall) -> list[int]:
        """`<|start|>assistant<|channel|>{channel} to={recipient} <|constrain|>json<|message|>...<|call|>`, or
        ` code` (the python tool) or nothing in place of the constraint."""
        encode = self._vocab.encode
        header = [*self.open_assistant, self._channel]
        if call.content_type == "json":
            header += [*encode(f"{call.channel} to={call.recipient} "), self._constrain, *encode("json")]
        else:
            header += encode(f"{call.channel} to={call.recipient}"
                             + (f" {call.content_type}" if call.content_type else ""))
        return [*header, self._message, *self.encode(call.arguments), self._call]


def encode_in_pieces(vocab: Vocab, text: str, piece_chars: int) -> list[int]:
    """`vocab.encode(text)`, a call per piece of about `piece_chars` cut where tokens must end (see `_CUT`)."""
    if len(text) <= piece_chars:
        return vocab.encode(text)
    tokens: list[int] = []
    start = 0
    while start < len(text):
        cut = _CUT.search(text, start + piece_chars) if len(text) - start > piece_chars else None
        end = cut.start() if cut is not None else len(text)
        tokens += vocab.encode(text[start:end])
        start = end
    return tokens


def item_key(item: Item) -> tuple[str | bool | bytes, ...]:
    """What an item's tokens depend on, as a tuple of strings (bytes for token ids): the collector stops tracking
    such a tuple, so a full cache adds nothing to its full collections (a call id is not rendered: not in the key)."""
    if isinstance(item, UserMessage):
        return "user", item.text
    if isinstance(item, Reasoning):
        if item.tokens is None:
            return "reasoning", item.text
        return "reasoning tokens", array("I", item.tokens).tobytes()
    if isinstance(item, AssistantMessage):
        return "assistant", item.text, item.preamble
    if isinstance(item, ToolCall):
        return "call", item.recipient, item.freeform, item.arguments
    if isinstance(item, ToolResult):
        return "result", item.recipient, item.output
    if isinstance(item, ServerToolCall):
        return "server call", item.recipient, item.channel, item.content_type or "", item.arguments
    if isinstance(item, ServerToolResult):
        return "server result", item.recipient, item.channel, item.output
    return "instructions", item.text


def item_size(item: Item) -> int:
    """About how much work encoding the item is: the length of its text."""
    if isinstance(item, (ToolCall, ServerToolCall)):
        return len(item.arguments)
    if isinstance(item, (ToolResult, ServerToolResult)):
        return len(item.output)
    return len(item.text)
