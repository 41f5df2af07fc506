"""What a WebSocket connection remembers of its responses, so that the next turn costs only what it adds.

Each response the connection finished is kept as a `Turn`: the conversation's items (for `previous_response_id`
even with `store: false`), the same conversation as the renderer reads it, and its prompt's tokens with what a
continuation needs (parsers/continuation.py). A response naming a remembered turn translates and renders only
its new items (the turn's output, then its input) and extends the turn's tokens.

What is kept is bounded in bytes, measured on what a turn holds (`turn_bytes`), least recently used first:
`MAX_TURNS` and `CONNECTION_BYTES` per connection, and the server's `TurnMemory` across all of its connections
(`--ws-turns-memory`). A turn dropped is only a cost: the next response naming it is rendered in full from the
store, or, with `store: false`, is a `previous_response_not_found`, as after a reconnection. Prompt tokens are
kept as 4-byte ids (`array('I')`): a list of Python ints costs 8 to 40 bytes a token. Everything goes with the
connection (`Turns.close`).

Requests that run server-side tools, and items other than messages, reasoning, function and custom tool calls and
their outputs (server-side tools' items, compaction, additional tools), take the full path (routes.py renders
them): what they mean depends on more than each item alone.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from parsers.continuation import Rendered, extend, first
from parsers.conversation import Item, ToolCall
from parsers.render import Renderer
from proxy.responses.request.conversation import conversation_of
from proxy.responses.request.parse import ResponsesRequest, prompt_with
from proxy.responses.request.unseal import Unsealer, off_loop_when_large

MAX_TURNS = 32  # one per named lane (OpenAI allows 32 per connection)
# Per connection: 10 turns of a 100,000-token conversation (1.5 MiB each: its items, their translation, its tokens).
CONNECTION_BYTES = 16 << 20
SERVER_BYTES = 1 << 30  # all connections of one process together (--ws-turns-memory), by default
_PLAIN = frozenset({"message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
                    "custom_tool_call_output", "configuration_update"})


@dataclass(frozen=True)
class Turn:
    items: list[dict[str, Any]]  # the conversation: history, input and output, as a later request's history
    conversation: list[Item] | None  # the same, translated; None: the next turn takes the full path
    calls: dict[str, ToolCall]  # by call id, for the outputs of later turns
    rendered: Rendered | None  # its prompt, for the next turn to extend


@dataclass
class Plan:
    """How a response's prompt was made; `Turns.remember` makes the next `Turn` from it."""

    history: list[dict[str, Any]]
    items: list[dict[str, Any]]
    conversation: list[Item] | None
    calls: dict[str, ToolCall]
    rendered: Rendered | None
    extended: bool = False  # the prompt extended the previous turn's tokens


class TurnMemory:
    """The bytes the turns of all of a process's connections hold: past `budget`, the turn least recently used,
    whichever connection's, is dropped. Used on the event loop only."""

    def __init__(self, budget: int = SERVER_BYTES) -> None:
        self.budget = budget
        self.used = 0
        self._order: OrderedDict[tuple[Turns, str], int] = OrderedDict()

    def add(self, owner: Turns, response_id: str, size: int) -> None:
        self._order[(owner, response_id)] = size
        self.used += size
        while self.used > self.budget:
            oldest, dropped = next(iter(self._order))
            oldest.forget(dropped)

    def touch(self, owner: Turns, response_id: str) -> None:
        self._order.move_to_end((owner, response_id))

    def remove(self, owner: Turns, response_id: str) -> None:
        self.used -= self._order.pop((owner, response_id), 0)


class Turns:
    def __init__(self, unsealer: Callable[[], Unsealer], memory: TurnMemory, max_turns: int = MAX_TURNS,
                 max_bytes: int = CONNECTION_BYTES) -> None:
        """`unsealer()` opens the reasoning blobs of a response's output items (proxy/responses/sealing.py);
        `memory` is the server's, shared by its connections."""
        self._unsealer = unsealer
        self._memory = memory
        self._max_turns, self._max_bytes = max_turns, max_bytes
        self._turns: OrderedDict[str, tuple[Turn, int]] = OrderedDict()  # least recently used first
        self.used = 0

    def get(self, response_id: Any) -> Turn | None:
        entry = self._turns.get(response_id) if isinstance(response_id, str) else None
        if entry is None:
            return None
        self._turns.move_to_end(response_id)
        self._memory.touch(self, response_id)
        return entry[0]

    def remember(self, response_id: str, plan: Plan, output: list[dict[str, Any]]) -> None:
        conversation = plan.conversation
        if conversation is not None and _plain(output) and not _ends_unphased(plan.items):
            calls = dict(plan.calls)
            conversation = conversation + conversation_of(output, 0, self._unsealer(), calls)
            rendered = plan.rendered
            if rendered is not None:  # 4 bytes a token id, where a list of ints takes 8 to 40
                rendered = replace(rendered, tokens=array("I", rendered.tokens))
        else:  # a later turn translates and renders the whole conversation
            conversation, calls, rendered = None, {}, None
        turn = Turn([*plan.history, *plan.items, *output], conversation, calls, rendered)
        size = turn_bytes(turn)
        self.forget(response_id)
        if size > min(self._max_bytes, self._memory.budget):
            return  # larger than the budget alone: not kept
        while self._turns and (self.used + size > self._max_bytes or len(self._turns) >= self._max_turns):
            self.forget(next(iter(self._turns)))
        self._turns[response_id] = (turn, size)
        self.used += size
        self._memory.add(self, response_id, size)

    def forget(self, response_id: Any) -> None:
        """Not continued again (a continuation of it failed: Open Responses evicts it), or dropped for room."""
        entry = self._turns.pop(response_id, None) if isinstance(response_id, str) else None
        if entry is not None:
            self.used -= entry[1]
            self._memory.remove(self, response_id)

    def close(self) -> None:
        """The connection is gone: its turns go, and their bytes go back to the server's budget."""
        for response_id in list(self._turns):
            self.forget(response_id)


def turn_bytes(turn: Turn) -> int:
    """What a turn holds, in bytes, as CPython lays it out (a string its items and their translation share counts
    once); token ids of reasoning blobs count as full ints, so the figure errs high."""
    rendered, seen = turn.rendered, set()
    held = _size(turn.items, seen) + _size(turn.conversation, seen) + _size(turn.calls, seen)
    if rendered is not None:
        held += sys.getsizeof(rendered.tokens) + sys.getsizeof(rendered.items) + _size(rendered.header, seen)
    return held


async def plan(renderer: Renderer, unsealer: Unsealer, request: ResponsesRequest, previous: Turn | None,
               history: list[dict[str, Any]], items: list[dict[str, Any]], generate: bool = True) -> Plan:
    """The prompt of `request`: extending `previous` when it can, else rendered in full (the renderer's piece
    cache still spares re-encoding what it rendered before). `generate: false` (a pre-warm) may hold
    instructions alone. `unsealer` opens this request's blobs (a 400 past the context window)."""
    if request.hosted or not _plain(items):  # the tool loop, or items of more than themselves: routes.py renders
        return Plan(history, items, None, {}, None)
    if previous is not None and previous.conversation is not None and previous.rendered is not None:
        calls = dict(previous.calls)
        added = await off_loop_when_large(items, lambda: conversation_of(items, 0, unsealer, calls))
        conversation = previous.conversation + added
        rendered = await extend(renderer, previous.rendered, prompt_with(request, conversation, generate))
        if rendered is not None:
            return Plan(history, items, conversation, calls, rendered, extended=True)
    if not _plain(history):
        return Plan(history, items, None, {}, None)
    calls = {}
    everything = history + items
    conversation = await off_loop_when_large(everything, lambda: conversation_of(everything, len(history), unsealer,
                                                                                 calls))
    prompt = prompt_with(request, conversation, generate)
    return Plan(history, items, conversation, calls, await first(renderer, prompt,
                                                                 await renderer.render_off_loop(prompt)))


def _plain(items: list[dict[str, Any]]) -> bool:
    return all(item["type"] in _PLAIN for item in items)


def _ends_unphased(items: list[dict[str, Any]]) -> bool:
    """An input ending in an assistant message without `phase` is a preamble or not by what follows it
    (proxy/responses/request/parse.py `_is_preamble`): what the next turn adds may change how it renders."""
    for item in reversed(items):
        if item["type"] != "reasoning":
            return item["type"] == "message" and item.get("role") == "assistant" and item.get("phase") is None
    return False


def value_bytes(value: Any) -> int:
    """Bytes of a JSON-like value, measured as a turn's are (a string it holds twice counts once)."""
    return _size(value, set())


def _size(value: Any, seen: set[int]) -> int:
    """Bytes of a JSON-like value or a frozen dataclass of them, containers and leaves; strings in `seen` (by id)
    are counted already."""
    if isinstance(value, str | bytes):
        if id(value) in seen:
            return 0
        seen.add(id(value))
        return sys.getsizeof(value)
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(_size(key, seen) + _size(item, seen) for key, item in value.items())
    if isinstance(value, list | tuple):
        if value and type(value[0]) is int:  # token ids: 8 bytes each in the sequence, 32 for the int object
            return sys.getsizeof(value) + 32 * len(value)
        return sys.getsizeof(value) + sum(_size(item, seen) for item in value)
    if is_dataclass(value) and not isinstance(value, type):
        return sys.getsizeof(value) + sum(_size(getattr(value, field.name), seen) for field in fields(value))
    return sys.getsizeof(value)
