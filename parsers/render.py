"""Rendering a conversation into Harmony prompt tokens.

The prompt is the system and developer messages (parsers/opening_messages.py), then the conversation's items,
each a message of its own (parsers/message_tokens.py), then the `<|start|>assistant` the model continues from.
Reasoning is kept only in the current turn while its tool loop is still going; a turn that ended in a final
answer loses its analysis (the model was trained that way).

Reuse: every piece (the system message, the developer instructions, the tools section, each message) is
encoded on its own, as it always was here (in openai-harmony's form), so its tokens depend on its content alone. The
renderer keeps them in a bounded LRU keyed by content: the next turn of a conversation encodes only its new
messages, and an agent's tools are rendered once. Uncached work above `OFF_LOOP_CHARS` goes to a worker thread
(`render_off_loop`); long texts are encoded in pieces so that thread lets the event loop take the GIL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import NamedTuple

from openai_harmony import Message, RenderOptions, Role

from parsers.conversation import (
    AssistantMessage,
    Instructions,
    Item,
    Prompt,
    Reasoning,
    ServerToolCall,
    ServerToolResult,
    UserMessage,
)
from parsers.message_tokens import MessageWriter, item_key, item_size
from parsers.opening_messages import developer_sections, system_content
from parsers.vocab import Vocab
from tools.bounded_cache import BoundedCache, CacheStats
from tools.cache import ToolCatalog, ToolDeclarations

# Uncached work above this many characters of text is rendered in a worker thread (a hop costs ~0.1 ms; this
# much text takes ~3 ms to encode). Tool JSON counts double: openai-harmony renders it at about half the speed.
OFF_LOOP_CHARS = 12_000
# Past these, finding even a cached prompt's pieces and joining them takes over ~1 ms (~2 us an item).
_MANY_ITEMS = 500
_MANY_CHARS = 500_000


class _Part(NamedTuple):
    """A piece of the prompt not in the cache yet: `key` names its content, `size` estimates the work."""

    key: Hashable
    size: int
    make: Callable[[], list[int]]


class Renderer:
    """Renders prompts, reusing the tokens of every piece it rendered before (messages, instructions, tools).

    A piece's tokens depend only on its content (each message is a Harmony message of its own), so the second
    turn of a conversation encodes only its new messages, and the same tools render once. `cache_tokens` bounds
    the tokens held (about 45 bytes each); 0 turns the reuse off. `tools` checks and remembers tool declarations
    for the request parsers; it lives here because the tools' canonical keys are what the tool cache is keyed by.
    """

    def __init__(self, vocab: Vocab, tools: ToolCatalog | None = None, cache_tokens: int = 1_000_000) -> None:
        self._vocab = vocab
        self.tools = tools if tools is not None else ToolCatalog()
        self._declarations = ToolDeclarations()
        self._messages = MessageWriter(vocab)
        self._systems: dict[tuple[str, bool, tuple[str, ...]], tuple[int, ...]] = {}  # the few there are
        self._pieces: BoundedCache[Hashable, tuple[int, ...]] = BoundedCache(
            max_entries=cache_tokens // 32, max_weight=cache_tokens)

    def render(self, prompt: Prompt) -> list[int]:
        """Prompt token ids, ending with the `<|start|>assistant` the model continues from."""
        plan = self._lookup(prompt)
        return self._join(plan, self._make([part for part in plan if isinstance(part, _Part)]))

    async def render_off_loop(self, prompt: Prompt) -> list[int]:
        """`render`, with the work in a worker thread when there is much of it: all of it for a very long
        prompt (even finding its pieces in the cache takes milliseconds), else only the uncached pieces."""
        if len(prompt.items) > _MANY_ITEMS or sum(map(item_size, prompt.items)) > _MANY_CHARS:
            return await asyncio.to_thread(self.render, prompt)
        plan = self._lookup(prompt)
        missing = [part for part in plan if isinstance(part, _Part)]
        if sum(part.size for part in missing) < OFF_LOOP_CHARS:
            return self._join(plan, self._make(missing))
        return self._join(plan, await asyncio.to_thread(self._make, missing))

    async def render_items(self, items: Sequence[Item]) -> list[int]:
        """The tokens of `items` alone, exactly as a full render writes them (each is a message of its own):
        what a continuation appends (parsers/continuation.py). New pieces are encoded off the loop when large."""
        plan = [self._cached(item_key(item), item_size(item), partial(self._messages.item, item)) for item in items]
        missing = [part for part in plan if isinstance(part, _Part)]
        if sum(part.size for part in missing) < OFF_LOOP_CHARS:
            return self._join(plan, self._make(missing))
        return self._join(plan, await asyncio.to_thread(self._make, missing))

    @property
    def open_assistant(self) -> tuple[int, ...]:
        """`<|start|>assistant`: every prompt ends with it."""
        return self._messages.open_assistant

    def cache_stats(self) -> CacheStats:
        return self._pieces.stats()

    def _lookup(self, prompt: Prompt) -> list[tuple[int, ...] | _Part]:
        """The prompt as token pieces: known ones as tokens, the others as parts still to render."""
        leading, rest = split_leading_instructions(prompt.items)
        has_tools = bool(prompt.tools or prompt.namespaces or prompt.tool_namespaces)
        plan: list[tuple[int, ...] | _Part] = [
            self.system_message(prompt.reasoning_effort, has_tools, prompt.builtin_tools)]
        plan += self._developer(leading, prompt)
        for item in _visible_history(rest):  # ~2 us an item when cached: a long conversation has many
            plan.append(self._cached(item_key(item), item_size(item), partial(self._messages.item, item)))
        plan.append(self._messages.open_assistant)
        return plan

    def _make(self, parts: list[_Part]) -> list[tuple[int, ...]]:
        made = []
        for part in parts:
            tokens = tuple(part.make())
            self._pieces.put(part.key, tokens, len(tokens))
            made.append(tokens)
        return made

    @staticmethod
    def _join(plan: list[tuple[int, ...] | _Part], made: list[tuple[int, ...]]) -> list[int]:
        tokens: list[int] = []
        fresh = iter(made)
        for piece in plan:
            tokens += next(fresh) if isinstance(piece, _Part) else piece
        return tokens

    def system_message(self, effort: str, with_tools: bool, builtin_tools: Sequence[str] = ()) -> tuple[int, ...]:
        """The system message's tokens, openai-harmony's own rendering: identity, cutoff, effort, channels, the
        line sending `functions` calls to commentary when `with_tools`, and the built-in tools named (of
        `opening_messages.BUILTIN_TOOLS`) under `# Tools`, in the library's order whatever order they are named in."""
        key = (effort, with_tools, tuple(sorted(set(builtin_tools))))
        if key not in self._systems:
            content = system_content(effort, key[2])
            self._systems[key] = tuple(self._vocab.encoding.render(
                Message.from_role_and_content(Role.SYSTEM, content),
                RenderOptions(conversation_has_function_tools=with_tools)
            ))
        return self._systems[key]

    def _developer(self, leading: list[Instructions], prompt: Prompt) -> list[tuple[int, ...] | _Part]:
        """The developer message: its header, each section's tokens (parsers/opening_messages.py), `<|end|>`."""
        sections = developer_sections(leading, prompt, self._declarations)
        if not sections:
            return []
        pieces: list[tuple[int, ...] | _Part] = [self._messages.developer_header]
        for section in sections:
            pieces.append(self._cached(section.key, section.size, partial(self._encode_text, section.text)))
        pieces.append((self._messages.end,))
        return pieces

    def _cached(self, key: Hashable, size: int, make: Callable[[], list[int]]) -> tuple[int, ...] | _Part:
        tokens = self._pieces.get(key)
        return tokens if tokens is not None else _Part(key, size, make)

    def _encode_text(self, text: Callable[[], str]) -> list[int]:
        return self._messages.encode(text())


def split_leading_instructions(items: Sequence[Item]) -> tuple[list[Instructions], list[Item]]:
    position = 0
    while position < len(items) and isinstance(items[position], Instructions):
        position += 1
    return list(items[:position]), list(items[position:])  # type: ignore[arg-type]


def _visible_history(items: list[Item]) -> list[Item]:
    """Drop reasoning except in a current turn whose tool loop has not reached a final answer. Built-in tool calls
    and their results on the analysis channel are chain of thought too: they go with it (as openai-harmony drops
    every analysis message of a finished turn)."""
    last_user = max((i for i, item in enumerate(items) if isinstance(item, UserMessage)), default=-1)
    current = items[last_user + 1 :]
    loop_open = not any(isinstance(item, AssistantMessage) and not item.preamble for item in current)
    return [
        item
        for position, item in enumerate(items)
        if not is_analysis(item) or (loop_open and position > last_user)
    ]


def is_analysis(item: Item) -> bool:
    return isinstance(item, Reasoning) or (isinstance(item, (ServerToolCall, ServerToolResult))
                                           and item.channel == "analysis")
