"""The streaming Harmony output parser: generated token ids in, item events out.

One parser serves streaming and non-streaming alike (non-streaming folds the same events), and it gives the
same events, merged, for any split of the same token stream. It never raises on model output and never lets
a special token or header text into an item's text. It recovers from what gpt-oss really writes:

- the header in any order (`to=` before or after `<|channel|>`), any content type or none, no channel;
- `<|channel|>` written twice in one header: the later channel decides (`parsers/header.py`);
- a missing or repeated `<|start|>assistant`;
- `<|start|>` or `<|channel|>` inside a message body: an implicit end of that message;
- text with no header at all: final content;
- a message closed (`<|end|>`, `<|return|>`, `<|call|>`) before its `<|message|>` came (missing, or a stray token
  in its place): the recognisable header, the rest its text (unless punctuation alone); a header that outgrows
  MAX_HEADER_BYTES is read the same way, and its message goes on. A header a new `<|start|>` interrupts was
  abandoned: dropped;
- a bare channel name right before `<|channel|>` or `<|start|>`: header debris, dropped (before an end token it
  is what the model said);
- a malformed header, or one addressed to a namespace other than `functions` (`browser.search`, `python`):
  that message is skipped whole, the rest is kept; unless the namespace is one the parser was given (tools the
  server runs: an MCP server's, or the built-in `browser` and `python` offered), whose messages are server calls;
- output cut off anywhere: the open item ends incomplete; a header cut off after a stray token where its
  `<|message|>` should be is read as a message closed there (as above), a half-written header is dropped.

Cost per token does not grow with the message: a body token is one list lookup and one append (openai-harmony's
StreamableParser copies the whole message on every `current_content`, and raises on bare text).
"""

from __future__ import annotations

import codecs
import enum
from collections.abc import Sequence

from parsers.events import Event, ItemDone, ItemKind, ItemStarted
from parsers.header import Header, Marker, could_start_header, is_header_fragment, parse_header, split_unmarked_message
from parsers.vocab import Vocab

# A header longer than this is not a header: the message is skipped rather than buffered without bound.
MAX_HEADER_BYTES = 1024

_CHANNEL_KINDS = {"analysis": ItemKind.REASONING, "commentary": ItemKind.PREAMBLE, "final": ItemKind.FINAL}
_FUNCTIONS = "functions."


class _Mode(enum.Enum):
    PREFIX = 0  # between messages: text here may be a header missing its <|start|>, or bare content
    HEADER = 1  # inside a header after <|start|>, <|channel|> or <|constrain|>
    BODY = 2  # inside the body of an item we emit
    SKIP_HEADER = 3  # inside a header too long to be one
    SKIP_BODY = 4  # inside the body of a message we skip


class OutputParser:
    """Parses one assistant turn, from the token after the prompt's final `<|start|>assistant`."""

    def __init__(self, vocab: Vocab, namespaces: frozenset[str] = frozenset(),
                 keep_reasoning_tokens: bool = False, tool_namespaces: frozenset[str] = frozenset()) -> None:
        """`namespaces`: recipients (`weather`, `browser`, `python`) whose messages are server calls;
        `keep_reasoning_tokens`: each reasoning item's `ItemDone` carries its body's token ids;
        `tool_namespaces`: the client's namespaces besides `functions`, whose messages are tool calls."""
        self._namespaces = namespaces
        self._tool_namespaces = tool_namespaces
        self._kept: list[int] | None = None  # every token fed, when reasoning tokens are kept
        if keep_reasoning_tokens:
            self._kept = []
            self.feed = self._feed_kept  # type: ignore[method-assign]  # the plain feed stays free of the check
        self._at = 0  # position, among the tokens kept, of the special token being handled
        self._body_start = 0  # where the open item's body begins
        self._token_text = vocab.token_text
        self._token_bytes = vocab.token_bytes
        self._text_token_count = vocab.text_token_count
        special = vocab.special
        self._start, self._channel, self._constrain = special.start, special.channel, special.constrain
        self._message = special.message
        self._ends = frozenset({special.end, special.return_, special.call})

        # The prompt ended with <|start|>assistant, so we begin where a header would.
        self._mode = _Mode.PREFIX
        self._segments: list[tuple[Marker, bytearray]] = [(Marker.NONE, bytearray())]
        self._header_bytes = 0
        self._prefix_tokens = 0
        self._segment_ends: list[int] = []  # where each token of the last header segment ends, in bytes

        self._item = -1  # index of the open item
        self._kind: ItemKind | None = None
        self._item_tokens = 0
        self._next_index = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = False  # the decoder holds the first bytes of a character
        self._plain_body = False  # in a body with no half character pending: the single-token fast path
        self._reasoning_tokens = 0  # of the reasoning items already closed

    @property
    def reasoning_tokens(self) -> int:
        """Body tokens of reasoning so far, an item still open included."""
        open_item = self._item_tokens if self._kind is ItemKind.REASONING else 0
        return self._reasoning_tokens + open_item

    def feed(self, tokens: Sequence[int]) -> list[Event]:
        """Parse newly generated tokens; return the events they complete."""
        if self._plain_body and len(tokens) == 1:
            # The commonest step of all: one whole-character text token inside a body (engines stream one
            # token per step unless stream_interval > 1). Everything else takes the general loop.
            token = tokens[0]
            if token < self._text_token_count:
                piece = self._token_text[token]
                if piece is not None:
                    self._item_tokens += 1
                    return [piece] if piece else []
        events: list[Event] = []
        run: list[str] = []  # body text of the open item in this call, one piece per token
        token_text, text_token_count = self._token_text, self._text_token_count
        in_body, pending = self._mode is _Mode.BODY, self._pending
        # Where a special token stands among those kept (sealed reasoning): counted outside the body path only.
        done = len(self._kept) - len(tokens) if self._kept is not None else 0
        for token in tokens:
            if in_body and token < text_token_count:  # the hot path: a body token
                piece = token_text[token]
                if piece is None or pending:
                    piece = self._decode_partial(token)
                    pending = self._pending
                run.append(piece)
                continue
            if run:
                done += len(run)
                self._flush(run, events)
                run = []
            if token < text_token_count:
                self._header_text(token, events)
            else:
                self._at = done
                self._special(token, events)
            done += 1
            in_body, pending = self._mode is _Mode.BODY, self._pending
        if run:
            self._flush(run, events)
        self._plain_body = self._mode is _Mode.BODY and not self._pending
        return events

    def _feed_kept(self, tokens: Sequence[int]) -> list[Event]:
        self._kept += tokens  # type: ignore[operator]
        return OutputParser.feed(self, tokens)

    def finish(self) -> list[Event]:
        """The generation ended: close an item cut off mid-body or after an unmarked header (its text kept, as an
        end token would), drop a half-written header."""
        events: list[Event] = []
        self._at = len(self._kept) if self._kept is not None else 0
        if self._mode is _Mode.BODY or (self._mode is _Mode.HEADER and self._open_unmarked(events)):
            self._close(complete=False, events=events)
        elif self._mode is _Mode.PREFIX:
            self._settle_prefix(complete=False, events=events)
        self._reset_header(_Mode.PREFIX)
        self._plain_body = False
        return events

    # -- text outside a body -------------------------------------------------------------------------

    def _header_text(self, token: int, events: list[Event]) -> None:
        mode = self._mode
        if mode is _Mode.SKIP_BODY or mode is _Mode.SKIP_HEADER:
            return
        piece = self._token_bytes[token]
        self._header_bytes += len(piece)
        segment = self._segments[-1][1]
        segment.extend(piece)
        if mode is _Mode.HEADER:
            self._segment_ends.append(len(segment))
            if self._header_bytes > MAX_HEADER_BYTES and not self._open_unmarked(events):
                self._mode = _Mode.SKIP_HEADER
            return
        # PREFIX: hold the text while it may still be a header; once it reads as prose it is bare content.
        self._prefix_tokens += 1
        held = self._segments[0][1]
        if not could_start_header(held.decode("utf-8", "replace")):
            self._open(ItemKind.FINAL, None, events)
            self._item_tokens = self._prefix_tokens
            text = self._decoder.decode(bytes(held))
            self._pending = bool(self._decoder.getstate()[0])
            if text:
                events.append(text)

    # -- special tokens ------------------------------------------------------------------------------

    def _special(self, token: int, events: list[Event]) -> None:
        mode = self._mode
        if token in self._ends or token == self._start:
            if mode is _Mode.BODY or (mode is _Mode.HEADER and token != self._start and self._open_unmarked(events)):
                self._close(complete=True, events=events)
            elif mode is _Mode.PREFIX:
                self._settle_prefix(complete=True, events=events, before_start=token == self._start)
            self._reset_header(_Mode.HEADER if token == self._start else _Mode.PREFIX)
        elif token == self._channel or token == self._constrain:
            marker = Marker.CHANNEL if token == self._channel else Marker.CONSTRAIN
            if mode is _Mode.BODY or mode is _Mode.SKIP_BODY:
                if marker is Marker.CONSTRAIN:
                    return  # stray inside a body: dropped
                if mode is _Mode.BODY:
                    self._close(complete=True, events=events)
                self._reset_header(_Mode.HEADER)  # <|channel|> inside a body: implicit end
            elif mode is _Mode.SKIP_HEADER:
                return
            self._segments.append((marker, bytearray()))
            self._segment_ends = []
            self._mode = _Mode.HEADER
        elif token == self._message:
            if mode is _Mode.PREFIX or mode is _Mode.HEADER:
                self._begin_body(events)
            elif mode is _Mode.SKIP_HEADER:
                self._mode = _Mode.SKIP_BODY
        # Any other special token (<|endoftext|>, reserved ids, ids past the vocabulary) is dropped.

    def _settle_prefix(self, complete: bool, events: list[Event], before_start: bool = False) -> None:
        """Held text ended by a boundary: a complete header fragment is dropped, anything else was bare content.
        Before a `<|start|>`, a lone channel name is debris too: the model began a header, then a new message."""
        held = bytes(self._segments[0][1])
        text = held.decode("utf-8", "replace")
        if not text.strip() or is_header_fragment(text) or (before_start and could_start_header(text + " ")):
            return
        self._open(ItemKind.FINAL, None, events)
        self._item_tokens = self._prefix_tokens
        text = self._decoder.decode(held, True)
        if text:
            events.append(text)
        self._close(complete, events)

    def _begin_body(self, events: list[Event]) -> None:
        header = parse_header([(marker, bytes(text).decode("utf-8", "replace")) for marker, text in self._segments])
        target = _classify(header, self._namespaces, self._tool_namespaces)
        if target is None:
            self._mode = _Mode.SKIP_BODY
        else:
            channel = header.channel if target[0] is ItemKind.SERVER_CALL and header is not None else None
            self._open(target[0], target[1], events, channel, target[2])

    def _open_unmarked(self, events: list[Event]) -> bool:
        """Open the item of a message whose `<|message|>` never came, with the text its header holds so far."""
        segments = [(marker, bytes(text).decode("utf-8", "surrogateescape")) for marker, text in self._segments]
        split = split_unmarked_message(segments)
        if split is None:
            return False
        header, start = split
        body_start = len(segments[-1][1][:start].encode("utf-8", "surrogateescape"))
        body = bytes(self._segments[-1][1][body_start:])
        target = _classify(header, self._namespaces, self._tool_namespaces)
        if target is None or not _is_message(body, target[0]):
            return False
        channel = header.channel if target[0] is ItemKind.SERVER_CALL else None
        self._open(target[0], target[1], events, channel, target[2])
        self._item_tokens = sum(1 for end in self._segment_ends if end > body_start)
        text = self._decoder.decode(body)
        self._pending = bool(self._decoder.getstate()[0])
        if text:
            events.append(text)
        return True

    # -- items ---------------------------------------------------------------------------------------

    def _open(self, kind: ItemKind, name: str | None, events: list[Event], channel: str | None = None,
              namespace: str | None = None) -> None:
        self._item, self._kind, self._item_tokens = self._next_index, kind, 0
        self._body_start = self._at + 1  # after <|message|> (reasoning always has one)
        self._next_index += 1
        self._decoder.reset()
        self._pending = False
        self._mode = _Mode.BODY
        events.append(ItemStarted(self._item, kind, name, channel, namespace))

    def _flush(self, run: list[str], events: list[Event]) -> None:
        self._item_tokens += len(run)
        text = "".join(run)
        if text:
            events.append(text)

    def _decode_partial(self, token: int) -> str:
        piece = self._decoder.decode(self._token_bytes[token])
        self._pending = bool(self._decoder.getstate()[0])
        return piece

    def _close(self, complete: bool, events: list[Event]) -> None:
        if self._pending:
            tail = self._decoder.decode(b"", True)  # a character cut in half becomes U+FFFD
            if tail:
                events.append(tail)
            self._pending = False
        tokens = None
        if self._kind is ItemKind.REASONING:
            self._reasoning_tokens += self._item_tokens
            if self._kept is not None:  # stray special tokens in the body included: exactly what was generated
                tokens = tuple(self._kept[self._body_start:self._at])
        events.append(ItemDone(self._item, complete, self._item_tokens, tokens))
        self._item, self._kind = -1, None

    def _reset_header(self, mode: _Mode) -> None:
        self._mode = mode
        self._segments = [(Marker.NONE, bytearray())]
        self._header_bytes = 0
        self._prefix_tokens = 0
        self._segment_ends = []


def _is_message(body: bytes, kind: ItemKind) -> bool:
    """Whether what follows an unmarked header is a message: arguments of a call, or text with a word in it
    (punctuation alone, `...?`, is what constrained decoding leaves behind in a header, seen from real gpt-oss)."""
    if kind is ItemKind.TOOL_CALL or kind is ItemKind.SERVER_CALL:
        return bool(body.strip())
    return any(character.isalnum() for character in body.decode("utf-8", "replace"))


def _classify(header: Header | None, namespaces: frozenset[str],
              tool_namespaces: frozenset[str]) -> tuple[ItemKind, str | None, str | None] | None:
    """What a message becomes: (kind, function name or server call recipient, a tool call's namespace other than
    `functions`), or None to skip it."""
    if header is None:
        return None
    recipient = header.recipient
    if recipient is None:
        return _CHANNEL_KINDS.get(header.channel or "final", ItemKind.FINAL), None, None
    if recipient.startswith(_FUNCTIONS) and len(recipient) > len(_FUNCTIONS):
        return ItemKind.TOOL_CALL, recipient[len(_FUNCTIONS) :], None
    namespace, _, member = recipient.partition(".")
    if tool_namespaces and member and namespace in tool_namespaces:
        return ItemKind.TOOL_CALL, member, namespace
    if namespaces and namespace in namespaces:
        return ItemKind.SERVER_CALL, recipient, None
    # Built-in tools (browser.*, python, container.*) and other namespaces were not offered by this server:
    # their payload must neither leak nor become a call to a user function of the same short name.
    return None
