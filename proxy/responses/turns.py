"""What a WebSocket connection remembers of its responses, so that the next turn costs only what it adds.

Each response the connection finished is kept as a `Turn`: the conversation's items (for `previous_response_id`
even with `store: false`), the same conversation as the renderer reads it, and its prompt's tokens with what a
continuation needs (parsers/continuation.py). A response naming a remembered turn translates and renders only
its new items (the turn's output, then its input) and extends the turn's tokens. What is kept is bounded
(`MAX_TURNS`, `MAX_TOKENS`, least recently used first) and dropped with the connection.

Requests that run server-side tools, and items other than messages, reasoning, function and custom tool calls and
their outputs (server-side tools' items, compaction, additional tools), take the full path (routes.py renders
them): what they mean depends on more than each item alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parsers.continuation import Rendered, extend, first
from parsers.conversation import Item, ToolCall
from parsers.render import Renderer
from proxy.responses.request.parse import ResponsesRequest, conversation_of, prompt_with
from proxy.responses.request.unseal import Unsealer, off_loop_when_large
from tools.cache import BoundedCache

MAX_TURNS = 32  # one per named lane (OpenAI allows 32 per connection)
MAX_TOKENS = 1 << 20  # ~8 MiB of token ids per connection; turns of one chain share their token objects
_PLAIN = frozenset({"message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
                    "custom_tool_call_output"})


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


class Turns:
    def __init__(self, unsealer: Callable[[], Unsealer], max_turns: int = MAX_TURNS,
                 max_tokens: int = MAX_TOKENS) -> None:
        """`unsealer()` opens the reasoning blobs of a response's output items (proxy/responses/sealing.py)."""
        self._unsealer = unsealer
        self._turns: BoundedCache[str, Turn] = BoundedCache(max_entries=max_turns, max_weight=max_tokens)

    def get(self, response_id: Any) -> Turn | None:
        return self._turns.get(response_id) if isinstance(response_id, str) else None

    def remember(self, response_id: str, plan: Plan, output: list[dict[str, Any]]) -> None:
        conversation = plan.conversation
        if conversation is not None and _plain(output) and not _ends_unphased(plan.items):
            calls = dict(plan.calls)
            conversation = conversation + conversation_of(output, 0, self._unsealer(), calls)
            rendered = plan.rendered
        else:  # a later turn translates and renders the whole conversation
            conversation, calls, rendered = None, {}, None
        turn = Turn([*plan.history, *plan.items, *output], conversation, calls, rendered)
        self._turns.put(response_id, turn, len(rendered.tokens) if rendered is not None else len(turn.items))


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
