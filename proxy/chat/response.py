"""Item events → a Chat Completions answer: the streamed deltas and the final message, from one fold.

Mapping: reasoning → the reasoning field; final answers and commentary preambles → `content` (separate
messages joined by a blank line); tool calls → `tool_calls`, each announced once with its id, type and name,
then argument fragments. With `parallel_tool_calls: false` only the first call is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from parsers.events import Event, ItemKind, ItemStarted
from proxy.engines.base import FinishReason, Usage
from proxy.stop_strings import StopMatcher

_SEPARATOR = "\n\n"


class _Call:
    __slots__ = ("index", "id", "name", "pieces")

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

    def add(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        """Fold events in; return the deltas a stream should send for them."""
        deltas: list[dict[str, Any]] = []
        for event in events:
            if self._stop.hit:
                break
            if type(event) is str:
                target = self._target
                if isinstance(target, _Call):
                    target.pieces.append(event)
                    deltas.append({"tool_calls": [{"index": target.index, "function": {"arguments": event}}]})
                elif target is not None:
                    self._text(target, event, deltas)
            elif isinstance(event, ItemStarted):
                deltas.extend(self._start(event))
        return deltas

    def close(self) -> list[dict[str, Any]]:
        """The generation ended: release answer text held back while it might have begun a stop string."""
        held = self._stop.flush()
        if not held:
            return []
        self._content.append(held)
        return [{"content": held}]

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
            self._reasoning_field: "".join(self._reasoning) or None,
        }
        if self._calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": "".join(call.pieces)}}
                for call in self._calls
            ]
        return message

    def _start(self, event: ItemStarted) -> list[dict[str, Any]]:
        if event.kind is ItemKind.TOOL_CALL:
            if self._calls and not self._parallel:
                self._target = None
                return []
            call = _Call(len(self._calls), self._new_call_id(), event.name or "")
            self._calls.append(call)
            self._target = call
            announce = {"index": call.index, "id": call.id, "type": "function"}
            return [{"tool_calls": [{**announce, "function": {"name": call.name, "arguments": ""}}]}]
        field = "reasoning" if event.kind is ItemKind.REASONING else "content"
        self._target = field
        self._separate[field] = self._received[field]
        return []

    def _text(self, field: str, text: str, deltas: list[dict[str, Any]]) -> None:
        if self._separate[field]:
            self._separate[field] = False
            text = _SEPARATOR + text
        self._received[field] = True
        if field == "reasoning":
            self._reasoning.append(text)
            deltas.append({self._reasoning_field: text})
            return
        text = self._stop.feed(text)
        if text:
            self._content.append(text)
            deltas.append({"content": text})


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
    """Serializes `chat.completion.chunk`s; the parts that never change are rendered once per response."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        head = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._head = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]  # without the closing brace
        self._usage_null = ',"usage":null' if include_usage else ""
        self._open = self._head + ',"choices":[{"index":0,"delta":'

    def delta(self, delta: dict[str, Any]) -> str:
        body = json.dumps(delta, ensure_ascii=False, separators=(",", ":"))
        return f'{self._open}{body},"logprobs":null,"finish_reason":null}}]{self._usage_null}}}'

    def finish(self, reason: str) -> str:
        return f'{self._open}{{}},"logprobs":null,"finish_reason":"{reason}"}}]{self._usage_null}}}'

    def usage(self, usage: dict[str, Any]) -> str:
        return f'{self._head},"choices":[],"usage":{json.dumps(usage, separators=(",", ":"))}}}'
