"""Incremental prompts: the next turn of a conversation extends the tokens of the turn before it.

A full render joins the system and developer messages and every visible item of the conversation. When a turn
continues an earlier one (a WebSocket connection keeps its turns, proxy/responses/turns.py), the earlier
prompt's tokens stand as they are, and only the items added since (the earlier turn's output, then the new
input) are rendered, each alone, and appended. The result is token for token what a full render of the whole
conversation gives (tests/test_continuation.py), so the cost of a turn is its new items, not the conversation.

Harmony hides the reasoning of a turn that ended in a final answer (`_visible_history` in parsers/render.py).
While the current user turn's tool loop goes on, nothing rendered earlier changes; when a new user message
comes, or a final answer closes the loop, the current user turn (from its last user message on) is rendered
again from cached pieces, and everything before it stands.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from parsers.conversation import AssistantMessage, Instructions, Item, Prompt, UserMessage
from parsers.render import Renderer, is_analysis, split_leading_instructions


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt and what a continuation needs to extend it. Never changed once made: a continuation
    builds a new token list, so two turns may continue the same one."""

    tokens: Sequence[int]  # the whole prompt, ending with `<|start|>assistant`: a list, or an array('I') kept
    items: tuple[Item, ...]  # the conversation after its leading instructions, hidden items included
    header: tuple[Hashable, ...]  # what the system and developer messages depend on
    last_user: int  # index in `items` of the last user message; -1 when there is none
    loop_open: bool  # no final answer since the last user message: that turn's reasoning is visible
    tail_start: int  # token offset where the items after the last user message begin
    body_end: int  # token offset of the closing `<|start|>assistant`


def header_of(prompt: Prompt, leading: Sequence[Instructions]) -> tuple[Hashable, ...]:
    """Everything the system and developer messages are rendered from (parsers/opening_messages.py)."""
    return (prompt.reasoning_effort, tuple(sorted(set(prompt.builtin_tools))), tuple(item.text for item in leading),
            tuple(tool.key for tool in prompt.tools), tuple(sorted(prompt.namespaces.items())),
            tuple(sorted(prompt.tool_namespaces.items())),
            prompt.response_format)  # type: ignore[return-value]  # a ResponseFormat compares by value


async def first(renderer: Renderer, prompt: Prompt, tokens: list[int]) -> Rendered:
    """The continuation state of a prompt fully rendered into `tokens`."""
    leading, rest = split_leading_instructions(prompt.items)
    last_user = _last_user(rest, -1, 0)
    loop_open = not any(map(_is_final, rest[last_user + 1:]))
    tail = await renderer.render_items([item for item in rest[last_user + 1:] if loop_open or not is_analysis(item)])
    body_end = len(tokens) - len(renderer.open_assistant)
    return Rendered(tokens, tuple(rest), header_of(prompt, leading), last_user, loop_open, body_end - len(tail),
                    body_end)


async def extend(renderer: Renderer, previous: Rendered, prompt: Prompt) -> Rendered | None:
    """`prompt` rendered by extending `previous`, whose conversation its own must begin with; None when it
    cannot be (other instructions, tools, effort or format: the caller renders in full)."""
    leading, rest = split_leading_instructions(prompt.items)
    known = len(previous.items)
    if len(rest) < known or header_of(prompt, leading) != previous.header:
        return None
    new = rest[known:]
    last_user = _last_user(new, previous.last_user, known)
    if last_user == previous.last_user:
        loop_open = previous.loop_open and not any(map(_is_final, new))
    else:
        loop_open = not any(map(_is_final, rest[last_user + 1:]))
    if last_user == previous.last_user and loop_open == previous.loop_open:
        # Every item rendered before keeps its place and visibility: append the new ones.
        body = list(previous.tokens[:previous.body_end])  # a kept turn holds an array('I')
        body += await renderer.render_items([item for item in new if loop_open or not is_analysis(item)])
        tail_start = previous.tail_start
    else:
        # The current user turn's reasoning is hidden now: render that turn again (its pieces are cached).
        body = list(previous.tokens[:previous.tail_start])
        body += await renderer.render_items(
            [item for item in rest[previous.last_user + 1:last_user + 1] if not is_analysis(item)])
        tail_start = len(body)
        body += await renderer.render_items(
            [item for item in rest[last_user + 1:] if loop_open or not is_analysis(item)])
    body_end = len(body)
    body += renderer.open_assistant
    return Rendered(body, tuple(rest), previous.header, last_user, loop_open, tail_start, body_end)


def _last_user(items: Sequence[Item], before: int, offset: int) -> int:
    for position in range(len(items) - 1, -1, -1):
        if isinstance(items[position], UserMessage):
            return offset + position
    return before


def _is_final(item: Item) -> bool:
    return isinstance(item, AssistantMessage) and not item.preamble
