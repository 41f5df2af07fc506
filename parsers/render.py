"""Rendering a conversation into Harmony prompt tokens, with openai-harmony.

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
  openai-harmony writes `<|start|>assistant to=functions.NAME<|channel|>commentary`, a form linked to the
  model putting later calls on the analysis channel, so that one message is hand-rolled here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from openai_harmony import (
    Author,
    DeveloperContent,
    Message,
    ReasoningEffort,
    RenderOptions,
    Role,
    SystemContent,
    ToolDescription,
)

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

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
KNOWLEDGE_CUTOFF = "2024-06"


class Renderer:
    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._encoding = vocab.encoding
        special = vocab.special
        self._open_assistant = [special.start, *vocab.encode("assistant")]
        self._call_header_end = [special.constrain, *vocab.encode("json"), special.message]
        self._channel, self._call = special.channel, special.call

    def render(self, prompt: Prompt) -> list[int]:
        """Prompt token ids, ending with the `<|start|>assistant` the model continues from."""
        options = RenderOptions(conversation_has_function_tools=bool(prompt.tools))
        leading, rest = _split_leading_instructions(prompt.items)
        tokens = self._message(Message.from_role_and_content(Role.SYSTEM, self._system(prompt)), options)
        developer = _developer(leading, prompt)
        if developer is not None:
            tokens += self._message(Message.from_role_and_content(Role.DEVELOPER, developer), options)
        for item in _visible_history(rest):
            if isinstance(item, ToolCall):
                tokens += self._tool_call(item)
            else:
                tokens += self._message(_harmony_message(item), options)
        tokens += self._open_assistant
        return tokens

    def _system(self, prompt: Prompt) -> SystemContent:
        return (
            SystemContent.new()
            .with_reasoning_effort(EFFORTS[prompt.reasoning_effort])
            .with_knowledge_cutoff(KNOWLEDGE_CUTOFF)
        )

    def _message(self, message: Message, options: RenderOptions) -> list[int]:
        return self._encoding.render(message, options)

    def _tool_call(self, call: ToolCall) -> list[int]:
        vocab = self._vocab
        return [
            *self._open_assistant,
            self._channel,
            *vocab.encode(f"commentary to=functions.{call.name} "),
            *self._call_header_end,
            *vocab.encode(call.arguments),
            self._call,
        ]


def _split_leading_instructions(items: Sequence[Item]) -> tuple[list[Instructions], list[Item]]:
    position = 0
    while position < len(items) and isinstance(items[position], Instructions):
        position += 1
    return list(items[:position]), list(items[position:])  # type: ignore[arg-type]


def _developer(leading: list[Instructions], prompt: Prompt) -> DeveloperContent | None:
    sections = [item.text for item in leading if item.text]
    if prompt.response_format is not None:
        sections.append(_response_format_section(prompt.response_format))
    if not sections and not prompt.tools:
        return None
    content = DeveloperContent.new()
    if sections:
        content = content.with_instructions("\n\n".join(sections))
    if prompt.tools:
        content = content.with_function_tools(
            [ToolDescription.new(tool.name, tool.description, tool.parameters) for tool in prompt.tools]
        )
    return content


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


def _harmony_message(item: Item) -> Message:
    if isinstance(item, UserMessage):
        return Message.from_role_and_content(Role.USER, item.text)
    if isinstance(item, Reasoning):
        return Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel("analysis")
    if isinstance(item, AssistantMessage):
        channel = "commentary" if item.preamble else "final"
        return Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel(channel)
    if isinstance(item, ToolResult):
        author = Author.new(Role.TOOL, f"functions.{item.name}")
        return (
            Message.from_author_and_content(author, item.output).with_channel("commentary").with_recipient("assistant")
        )
    if isinstance(item, Instructions):
        return Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(item.text))
    raise TypeError(f"cannot render {type(item).__name__}")  # ToolCall is hand-rolled by the caller
