"""Item events → a Chat Completions answer: the streamed deltas and the final message, from one fold.

Mapping: reasoning → the reasoning field (or both fields, the same text in each); final answers and
commentary preambles → `content` (separate messages joined by a blank line); tool calls → `tool_calls`, each
announced once with its id, type and name, then argument fragments. With `parallel_tool_calls: false` only the
first call is kept.

The token path is hot, so a text delta is a plain `(key, text)` tuple (key: `content`, the reasoning field, or a
tool call's index), the texts of one engine step that go to the same place are sent as one delta, and
`ChunkWriter` writes it between bytes it rendered once per response, so a delta costs one JSON string escape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from parsers.events import Event, ItemKind, ItemStarted
from proxy.engines.base import FinishReason, Usage
from proxy.stop_strings import StopMatcher

_SEPARATOR = "\n\n"
TextDelta = tuple[str | int, str]  # (content | the reasoning field | a tool call's index, text)
Delta = TextDelta | dict[str, Any]  # dicts are the rare rest: role, tool call announcements


class _Call:
    __slots__ = ("id", "index", "name", "pieces")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index, self.id, self.name, self.pieces = index, call_id, name, []


class ChatTurn:
    def __init__(
        self,
        reasoning_field: str,
        parallel_tool_calls: bool,
        stop: tuple[str, ...],
        new_call_id: Callable[[], str],
    ) -> None:
        self._reasoning_field = reasoning_field
        self._parallel = parallel_tool_calls
        self._new_call_id = new_call_id
        self._stop = StopMatcher(stop)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[_Call] = []
        # where the open item's text goes: "content", "reasoning", a _Call, or None (ignored)
        self._target: Any = None
        self._received = {"content": False, "reasoning": False}  # the field has text (shown or held back)
        self._separate = {"content": False, "reasoning": False}  # a new message starts after earlier text

    @property
    def stopped(self) -> bool:
        """A stop string was hit: nothing more is added, and the engine should be stopped."""
        return self._stop.hit

    def add(self, events: Iterable[Event]) -> list[Delta]:
        """Fold events in; return the deltas a stream should send for them (text to one place merged)."""
        deltas: list[Delta] = []
        key: str | int | None = None  # where the pending text goes
        pending: list[str] = []
        for event in events:
            if self._stop.hit:
                break
            if type(event) is str:
                target = self._target
                if isinstance(target, _Call):
                    target.pieces.append(event)
                    to = target.index
                elif target is not None:
                    event = self._text(target, event)
                    if not event:
                        continue
                    to = self._reasoning_field if target == "reasoning" else "content"
                else:
                    continue
                if to != key and pending:
                    deltas.append((key, "".join(pending)))  # type: ignore[arg-type]
                    pending = []
                key = to
                pending.append(event)
            elif isinstance(event, ItemStarted):
                announce = self._start(event)
                if announce is not None:
                    if pending:
                        deltas.append((key, "".join(pending)))  # type: ignore[arg-type]
                        pending = []
                    deltas.append(announce)
        if pending:
            deltas.append((key, "".join(pending)))  # type: ignore[arg-type]
        return deltas

    def close(self) -> list[Delta]:
        """The generation ended: release answer text held back while it might have begun a stop string."""
        held = self._stop.flush()
        if not held:
            return []
        self._content.append(held)
        return [("content", held)]

    def finish_reason(self, engine_reason: FinishReason | None) -> str:
        if self._stop.hit:
            return "stop"
        if engine_reason == "length":
            return "length"
        return "tool_calls" if self._calls else "stop"

    def message(self) -> dict[str, Any]:
        content = "".join(self._content)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content or (None if self._calls else ""),
            "refusal": None,  # required by the spec; gpt-oss has no refusal channel, it refuses in its answer
        }
        for name in _fields(self._reasoning_field):
            message[name] = "".join(self._reasoning) or None
        if self._calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": "".join(call.pieces)}}
                for call in self._calls
            ]
        return message

    def _start(self, event: ItemStarted) -> dict[str, Any] | None:
        if event.kind is ItemKind.TOOL_CALL:
            if self._calls and not self._parallel:
                self._target = None
                return None
            call = _Call(len(self._calls), self._new_call_id(), event.name or "")
            self._calls.append(call)
            self._target = call
            announce = {"index": call.index, "id": call.id, "type": "function"}
            return {"tool_calls": [{**announce, "function": {"name": call.name, "arguments": ""}}]}
        field = "reasoning" if event.kind is ItemKind.REASONING else "content"
        self._target = field
        self._separate[field] = self._received[field]
        return None

    def _text(self, field: str, text: str) -> str:
        """Fold text in; return what may be shown now (answer text may be held back for stop strings)."""
        if self._separate[field]:
            self._separate[field] = False
            text = _SEPARATOR + text
        self._received[field] = True
        if field == "reasoning":
            self._reasoning.append(text)
            return text
        text = self._stop.feed(text)
        if text:
            self._content.append(text)
        return text


def _fields(reasoning_field: str) -> tuple[str, ...]:
    return ("reasoning_content", "reasoning") if reasoning_field == "both" else (reasoning_field,)


def usage_body(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
    if usage.cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return body


class ChunkWriter:
    """Serializes `chat.completion.chunk` SSE frames; what never changes is rendered to bytes once per response."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        head = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._head = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]  # without the closing brace
        self._usage_null = ',"usage":null' if include_usage else ""
        self._open = self._head + ',"choices":[{"index":0,"delta":'
        # delta key -> the frame's bytes around its text: before, then after each copy (two for both reasoning fields)
        self._text_frames: dict[str | int, tuple[bytes, ...]] = {}

    def frames(self, deltas: Iterable[Delta]) -> bytes:
        """The SSE frames of a step's deltas, one chunk each."""
        parts: list[bytes] = []
        for delta in deltas:
            if type(delta) is tuple:
                key, text = delta
                around = self._text_frames.get(key) or self._text_frame(key)
                escaped = encode_basestring(text).encode()
                parts.append(around[0])
                for after in around[1:]:
                    parts += (escaped, after)
            else:
                parts.append(self._frame(json.dumps(delta, ensure_ascii=False, separators=(",", ":"))))
        return b"".join(parts)

    def finish(self, reason: str) -> bytes:
        return self._frame(f'{{}},"logprobs":null,"finish_reason":"{reason}"}}]{self._usage_null}}}', opened=False)

    def usage(self, usage: dict[str, Any]) -> bytes:
        return f'data: {self._head},"choices":[],"usage":{json.dumps(usage, separators=(",", ":"))}}}\n\n'.encode()

    def _frame(self, rest: str, opened: bool = True) -> bytes:
        if opened:
            rest += f',"logprobs":null,"finish_reason":null}}]{self._usage_null}}}'
        return f"data: {self._open}{rest}\n\n".encode()

    def _text_frame(self, key: str | int) -> tuple[bytes, ...]:
        before = f"data: {self._open}"
        between: list[str] = []
        if isinstance(key, int):  # a tool call's arguments
            before += f'{{"tool_calls":[{{"index":{key},"function":{{"arguments":'
            after = "}}]}"
        else:
            first, *others = _fields(key)
            before += f'{{"{first}":'
            between = [f',"{other}":' for other in others]
            after = "}"
        after += f',"logprobs":null,"finish_reason":null}}]{self._usage_null}}}\n\n'
        self._text_frames[key] = around = (before.encode(), *(piece.encode() for piece in between), after.encode())
        return around
