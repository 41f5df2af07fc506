"""Rendering a conversation into Harmony prompt tokens.

Rules (the Harmony format docs, plus what keeps KV-cache prefixes stable):
- System message: model identity, knowledge cutoff, reasoning effort, required channels; no conversation date
  by default, so the prompt prefix is the same every day.
- Developer message: the system/developer messages that open the conversation, joined by blank lines in
  order under `# Instructions`, then the function tools, then the response format (`# Response Formats`, at
  the end as the Harmony docs place it); a section without content is left out, heading included. A system
  or developer message later in the conversation is rendered where it stands, as a developer message.
- Reasoning is kept only in the current turn while its tool loop is still going; a turn that ended in a final
  answer loses its analysis (the model was trained that way).
- History tool calls are written the way the model writes them,
  `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`.

openai-harmony renders the system message. The tools section is written by tools/typescript.py: the library's
TypeScript-like declarations exactly, except where the library loses information (it writes `anyOf` as `any`).
Messages that carry client text are written here, in exactly the library's form (tests/test_render.py compares
them token for token): the library's tokenizer is quadratic on long unbroken runs and costs ~100 us per message,
while `Vocab.encode` stays linear; and the library writes history tool calls as
`<|start|>assistant to=functions.NAME<|channel|>commentary`, a form linked to the model putting later calls on
the analysis channel.

Reuse: every piece (the system message, the developer instructions, the tools section, each message) is
encoded on its own, as it always was here (in openai-harmony's form), so its tokens depend on its content alone. The
renderer keeps them in a bounded LRU keyed by content: the next turn of a conversation encodes only its new
messages, and an agent's tools are rendered once. Uncached work above `OFF_LOOP_CHARS` goes to a worker thread
(`render_off_loop`); long texts are encoded in pieces so that thread lets the event loop take the GIL.
"""

from __future__ import annotations

import asyncio
import json
import re
from array import array
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import NamedTuple

from openai_harmony import (
    Message,
    ReasoningEffort,
    RenderOptions,
    Role,
    SystemContent,
    ToolNamespaceConfig,
)

from parsers.conversation import (
    AssistantMessage,
    Instructions,
    Item,
    Prompt,
    Reasoning,
    ServerToolCall,
    ServerToolResult,
    ToolCall,
    ToolResult,
    UserMessage,
)
from parsers.vocab import Vocab
from tools import typescript
from tools.cache import BoundedCache, CacheStats, ToolCatalog, ToolDeclarations
from tools.definitions import FunctionTool, ResponseFormat

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
KNOWLEDGE_CUTOFF = "2024-06"
# gpt-oss's built-in tools, declared in the system message as the model was trained to see them: openai-harmony's
# own configs (what `SystemContent.with_browser_tool()` and `.with_python_tool()` add).
BUILTIN_TOOLS = {"browser": ToolNamespaceConfig.browser, "python": ToolNamespaceConfig.python}

# openai-harmony's tokenizer holds the GIL for a whole call (~1 us per token), so a long text is encoded in
# pieces, each ending where the tokenizer's pre-tokenizer must end a token anyway: at a space between ASCII
# letters (" word" is one pre-token, the word before it ends there), or after a newline followed by an ASCII
# letter (no pre-token spans a newline into a letter). The tokens are the same; between pieces another thread
# (the event loop) can take the GIL.
_PIECE_CHARS = 8192
_CUT = re.compile(r"(?<=[A-Za-z])(?= [A-Za-z])|(?<=\n)(?=[A-Za-z])")
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
        special = vocab.special
        self._start, self._end, self._message = special.start, special.end, special.message
        self._channel, self._call, self._constrain = special.channel, special.call, special.constrain
        self._open_assistant = (special.start, *vocab.encode("assistant"))
        self._call_header_end = [special.constrain, *vocab.encode("json"), special.message]
        self._developer_header = (special.start, *vocab.encode("developer"), special.message)
        self._analysis_header = (*self._open_assistant, special.channel, *vocab.encode("analysis"), special.message)
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
        if len(prompt.items) > _MANY_ITEMS or sum(map(_size, prompt.items)) > _MANY_CHARS:
            return await asyncio.to_thread(self.render, prompt)
        plan = self._lookup(prompt)
        missing = [part for part in plan if isinstance(part, _Part)]
        if sum(part.size for part in missing) < OFF_LOOP_CHARS:
            return self._join(plan, self._make(missing))
        return self._join(plan, await asyncio.to_thread(self._make, missing))

    async def render_items(self, items: Sequence[Item]) -> list[int]:
        """The tokens of `items` alone, exactly as a full render writes them (each is a message of its own):
        what a continuation appends (parsers/continuation.py). New pieces are encoded off the loop when large."""
        plan = [self._cached(_key(item), _size(item), partial(self._item, item)) for item in items]
        missing = [part for part in plan if isinstance(part, _Part)]
        if sum(part.size for part in missing) < OFF_LOOP_CHARS:
            return self._join(plan, self._make(missing))
        return self._join(plan, await asyncio.to_thread(self._make, missing))

    @property
    def open_assistant(self) -> tuple[int, ...]:
        """`<|start|>assistant`: every prompt ends with it."""
        return self._open_assistant

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
            plan.append(self._cached(_key(item), _size(item), partial(self._item, item)))
        plan.append(self._open_assistant)
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
        `BUILTIN_TOOLS`) under `# Tools`, in the library's order whatever order they are named in."""
        key = (effort, with_tools, tuple(sorted(set(builtin_tools))))
        if key not in self._systems:
            content = system_content(effort, key[2])
            self._systems[key] = tuple(self._vocab.encoding.render(
                Message.from_role_and_content(Role.SYSTEM, content),
                RenderOptions(conversation_has_function_tools=with_tools)
            ))
        return self._systems[key]

    def _developer(self, leading: list[Instructions], prompt: Prompt) -> list[tuple[int, ...] | _Part]:
        """Harmony's developer message: its sections joined by blank lines, each only when it has content (an
        `# Instructions` heading only above instructions), the response format last (openai/harmony
        docs/format.md, "Structured output": "at the end of the developer message")."""
        instructions = "\n\n".join(item.text for item in leading if item.text)
        response_format = prompt.response_format
        has_tools = bool(prompt.tools or prompt.namespaces or prompt.tool_namespaces)
        if not instructions and not has_tools and response_format is None:
            return []
        pieces: list[tuple[int, ...] | _Part] = [self._developer_header]
        # Each piece ends in a line break before a '#', or in a letter before one: no token spans such a cut.
        if instructions:
            text = "# Instructions\n\n" + instructions + ("\n\n" if has_tools or response_format else "")
            pieces.append(self._cached(("developer text", text), len(text), partial(self._encode, text)))
        if has_tools:
            keys = tuple(tool.key for tool in prompt.tools)
            namespaces = tuple(sorted(prompt.namespaces.items()))
            described = tuple(sorted(prompt.tool_namespaces.items()))
            size = 2 * sum(map(len, keys)) + sum(len(text) for _, text in namespaces + described)
            pieces.append(self._cached(("tools", keys, namespaces, described), size, partial(
                self._tools_section, prompt.tools, prompt.namespaces, prompt.tool_namespaces)))
        if response_format is not None:
            text = ("\n\n" if has_tools else "") + _response_format_section(response_format)
            pieces.append(self._cached(("response format", text), len(text), partial(self._encode, text)))
        pieces.append((self._end,))
        return pieces

    def _cached(self, key: Hashable, size: int, make: Callable[[], list[int]]) -> tuple[int, ...] | _Part:
        tokens = self._pieces.get(key)
        return tokens if tokens is not None else _Part(key, size, make)

    def _tools_section(self, tools: Sequence[FunctionTool], namespaces: Mapping[str, str],
                       tool_namespaces: Mapping[str, str]) -> list[int]:
        """`# Tools ... } // namespace functions` (tools/typescript.py; tool text was checked for long runs), and
        beside `functions` the other namespaces (the client's namespace tools, MCP servers'), all in name order as
        openai-harmony writes them."""
        functions = [tool for tool in tools if tool.namespace is None]
        if not namespaces and not tool_namespaces:
            return self._encode(self._declarations.section(functions))
        sections = dict(namespaces)
        if functions:
            sections["functions"] = self._declarations.section(functions).removeprefix("# Tools\n\n")
        for name, description in tool_namespaces.items():
            members = [self._declarations.declaration(tool) for tool in tools if tool.namespace == name]
            sections[name] = typescript.namespace_section(name, description, members)
        return self._encode("# Tools\n\n" + "\n\n".join(sections[name] for name in sorted(sections)))

    def _item(self, item: Item) -> list[int]:
        if isinstance(item, UserMessage):
            return self._text_message("user", None, item.text)
        if isinstance(item, Reasoning):
            if item.tokens is not None:
                return [*self._analysis_header, *item.tokens, self._end]
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

    def _text_message(self, header: str, channel: str | None, text: str) -> list[int]:
        encode = self._vocab.encode
        tokens = [self._start, *encode(header)]
        if channel is not None:
            tokens += [self._channel, *encode(channel)]
        return tokens + [self._message, *self._encode(text), self._end]

    def _tool_call(self, call: ToolCall) -> list[int]:
        encode = self._vocab.encode
        return [
            *self._open_assistant,
            self._channel,
            *(encode(f"commentary to={call.recipient}") + [self._message] if call.freeform else
              [*encode(f"commentary to={call.recipient} "), *self._call_header_end]),
            *self._encode(call.arguments),
            self._call,
        ]

    def _server_call(self, call: ServerToolCall) -> list[int]:
        """`<|start|>assistant<|channel|>{channel} to={recipient} <|constrain|>json<|message|>...<|call|>`, or
        ` code` (the python tool) or nothing in place of the constraint."""
        encode = self._vocab.encode
        header = [*self._open_assistant, self._channel]
        if call.content_type == "json":
            header += [*encode(f"{call.channel} to={call.recipient} "), self._constrain, *encode("json")]
        else:
            header += encode(f"{call.channel} to={call.recipient}"
                             + (f" {call.content_type}" if call.content_type else ""))
        return [*header, self._message, *self._encode(call.arguments), self._call]

    def _encode(self, text: str) -> list[int]:
        return encode_in_pieces(self._vocab, text, _PIECE_CHARS)


def system_content(effort: str, builtin_tools: Sequence[str] = ()) -> SystemContent:
    """The system message: no conversation date (a stable prompt prefix), and the built-in tools named."""
    content = SystemContent.new().with_reasoning_effort(EFFORTS[effort]).with_knowledge_cutoff(KNOWLEDGE_CUTOFF)
    for name in builtin_tools:
        content = content.with_tools(BUILTIN_TOOLS[name]())
    return content


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


def _key(item: Item) -> tuple[str | bool | bytes, ...]:
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
        return "call", item.name, item.arguments
    if isinstance(item, ToolResult):
        return "result", item.name, item.output
    if isinstance(item, ServerToolCall):
        return "server call", item.recipient, item.channel, item.content_type or "", item.arguments
    if isinstance(item, ServerToolResult):
        return "server result", item.recipient, item.channel, item.output
    return "instructions", item.text


def _size(item: Item) -> int:
    if isinstance(item, (ToolCall, ServerToolCall)):
        return len(item.arguments)
    if isinstance(item, (ToolResult, ServerToolResult)):
        return len(item.output)
    return len(item.text)


def split_leading_instructions(items: Sequence[Item]) -> tuple[list[Instructions], list[Item]]:
    position = 0
    while position < len(items) and isinstance(items[position], Instructions):
        position += 1
    return list(items[:position]), list(items[position:])  # type: ignore[arg-type]


def _response_format_section(response_format: ResponseFormat) -> str:
    lines = ["# Response Formats", "", f"## {response_format.name}", ""]
    if response_format.description:
        lines.append(f"// {response_format.description}")
    lines.append(json.dumps(response_format.schema, separators=(",", ":"), ensure_ascii=False))
    return "\n".join(lines)


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
