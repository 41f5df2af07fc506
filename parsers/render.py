"""Rendering a conversation into Harmony prompt tokens.

Rules (the Harmony format docs, plus what keeps KV-cache prefixes stable):
- System message: model identity, knowledge cutoff, reasoning effort, required channels; no conversation date
  by default, so the prompt prefix is the same every day.
- Developer message: the system/developer messages that open the conversation, joined by blank lines in
  order, then the response-format section, then the function tools. A system or developer message later in
  the conversation is rendered where it stands, as a developer message.
- Reasoning is kept only in the current turn while its tool loop is still going; a turn that ended in a final
  answer loses its analysis (the model was trained that way).
- History tool calls are written the way the model writes them,
  `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`.

openai-harmony renders the system message and the tools section (its TypeScript-like declarations). Messages
that carry client text are written here, in exactly the library's form (tests/test_render.py compares them
token for token): the library's tokenizer is quadratic on long unbroken runs and costs ~100 us per message,
while `Vocab.encode` stays linear; and the library writes history tool calls as
`<|start|>assistant to=functions.NAME<|channel|>commentary`, a form linked to the model putting later calls on
the analysis channel.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from openai_harmony import DeveloperContent, Message, ReasoningEffort, RenderOptions, Role, SystemContent, ToolDescription

from parsers.conversation import (
    AssistantMessage,
    Instructions,
    Item,
    Prompt,
    Reasoning,
    ResponseFormat,
    ToolCall,
    ToolResult,
    UserMessage,
)
from parsers.vocab import Vocab
from tools.definitions import FunctionTool

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
KNOWLEDGE_CUTOFF = "2024-06"


class Renderer:
    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        special = vocab.special
        self._start, self._end, self._message = special.start, special.end, special.message
        self._channel, self._call = special.channel, special.call
        self._open_assistant = [special.start, *vocab.encode("assistant")]
        self._call_header_end = [special.constrain, *vocab.encode("json"), special.message]
        self._developer_header = [special.start, *vocab.encode("developer"), special.message]
        self._systems: dict[tuple[str, bool], list[int]] = {}  # the few system messages there are, rendered once

    def render(self, prompt: Prompt) -> list[int]:
        """Prompt token ids, ending with the `<|start|>assistant` the model continues from."""
        leading, rest = _split_leading_instructions(prompt.items)
        tokens = list(self._system(prompt.reasoning_effort, bool(prompt.tools)))
        tokens += self._developer(leading, prompt)
        for item in _visible_history(rest):
            tokens += self._item(item)
        tokens += self._open_assistant
        return tokens

    def _system(self, effort: str, with_tools: bool) -> list[int]:
        key = (effort, with_tools)
        if key not in self._systems:
            content = SystemContent.new().with_reasoning_effort(EFFORTS[effort]).with_knowledge_cutoff(KNOWLEDGE_CUTOFF)
            self._systems[key] = self._vocab.encoding.render(
                Message.from_role_and_content(Role.SYSTEM, content), RenderOptions(conversation_has_function_tools=with_tools)
            )
        return self._systems[key]

    def _developer(self, leading: list[Instructions], prompt: Prompt) -> list[int]:
        sections = [item.text for item in leading if item.text]
        if prompt.response_format is not None:
            sections.append(_response_format_section(prompt.response_format))
        if not sections and not prompt.tools:
            return []
        tokens = list(self._developer_header)
        if sections:
            tokens += self._vocab.encode("# Instructions\n\n" + "\n\n".join(sections) + ("\n\n" if prompt.tools else ""))
        if prompt.tools:
            return tokens + self._tools_section(prompt.tools)
        return tokens + [self._end]

    def _tools_section(self, tools: Sequence[FunctionTool]) -> list[int]:
        """`# Tools ...<|end|>`, by openai-harmony (tool text was checked for runs its tokenizer handles badly)."""
        content = DeveloperContent.new().with_function_tools(
            [ToolDescription.new(tool.name, tool.description, tool.parameters) for tool in tools]
        )
        rendered = self._vocab.encoding.render(Message.from_role_and_content(Role.DEVELOPER, content))
        return rendered[len(self._developer_header) :]

    def _item(self, item: Item) -> list[int]:
        if isinstance(item, UserMessage):
            return self._text_message("user", None, item.text)
        if isinstance(item, Reasoning):
            return self._text_message("assistant", "analysis", item.text)
        if isinstance(item, AssistantMessage):
            return self._text_message("assistant", "commentary" if item.preamble else "final", item.text)
        if isinstance(item, ToolCall):
            return self._tool_call(item)
        if isinstance(item, ToolResult):
            return self._text_message(f"functions.{item.name} to=assistant", "commentary", item.output)
        return self._text_message("developer", None, "# Instructions\n\n" + item.text)  # Instructions

    def _text_message(self, header: str, channel: str | None, text: str) -> list[int]:
        encode = self._vocab.encode
        tokens = [self._start, *encode(header)]
        if channel is not None:
            tokens += [self._channel, *encode(channel)]
        return tokens + [self._message, *encode(text), self._end]

    def _tool_call(self, call: ToolCall) -> list[int]:
        encode = self._vocab.encode
        return [
            *self._open_assistant,
            self._channel,
            *encode(f"commentary to=functions.{call.name} "),
            *self._call_header_end,
            *encode(call.arguments),
            self._call,
        ]


def _split_leading_instructions(items: Sequence[Item]) -> tuple[list[Instructions], list[Item]]:
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
    """Drop reasoning except in a current turn whose tool loop has not reached a final answer."""
    last_user = max((i for i, item in enumerate(items) if isinstance(item, UserMessage)), default=-1)
    current = items[last_user + 1 :]
    loop_open = not any(isinstance(item, AssistantMessage) and not item.preamble for item in current)
    return [
        item
        for position, item in enumerate(items)
        if not isinstance(item, Reasoning) or (loop_open and position > last_user)
    ]
