"""The messages every prompt opens with: the system message and the developer message.

- System message: model identity, knowledge cutoff, reasoning effort, required channels; no conversation date
  by default, so the prompt prefix is the same every day. openai-harmony renders it.
- Developer message: the system/developer messages that open the conversation, joined by blank lines in
  order under `# Instructions`, then the function tools, then the response format (`# Response Formats`, at
  the end as the Harmony docs place it); a section without content is left out, heading included. A system
  or developer message later in the conversation is rendered where it stands, as a developer message.

The tools section is written by tools/typescript.py: the library's TypeScript-like declarations exactly, except
where the library loses information (it writes `anyOf` as `any`). parsers/render.py encodes each section and
keeps its tokens by the section's key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import NamedTuple

from openai_harmony import ReasoningEffort, SystemContent, ToolNamespaceConfig

from parsers.conversation import Instructions, Prompt
from tools import typescript
from tools.cache import ToolDeclarations
from tools.definitions import FunctionTool, ResponseFormat

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
KNOWLEDGE_CUTOFF = "2024-06"
# gpt-oss's built-in tools, declared in the system message as the model was trained to see them: openai-harmony's
# own configs (what `SystemContent.with_browser_tool()` and `.with_python_tool()` add).
BUILTIN_TOOLS = {"browser": ToolNamespaceConfig.browser, "python": ToolNamespaceConfig.python}


def system_content(effort: str, builtin_tools: Sequence[str] = ()) -> SystemContent:
    """The system message: no conversation date (a stable prompt prefix), and the built-in tools named."""
    content = SystemContent.new().with_reasoning_effort(EFFORTS[effort]).with_knowledge_cutoff(KNOWLEDGE_CUTOFF)
    for name in builtin_tools:
        content = content.with_tools(BUILTIN_TOOLS[name]())
    return content


class Section(NamedTuple):
    """A piece of the developer message: `key` names its content, `size` estimates the work of writing and
    encoding it, `text` writes it, only when its tokens are not cached (`partial(str, text)` for a text at hand)."""

    key: Hashable
    size: int
    text: Callable[[], str]


def developer_sections(leading: Sequence[Instructions], prompt: Prompt,
                       declarations: ToolDeclarations) -> list[Section]:
    """Harmony's developer message, between its header and `<|end|>`: its sections joined by blank lines, each
    only when it has content (an `# Instructions` heading only above instructions), the response format last
    (openai/harmony docs/format.md, "Structured output": "at the end of the developer message"). No sections: no
    developer message."""
    instructions = "\n\n".join(item.text for item in leading if item.text)
    response_format = prompt.response_format
    has_tools = bool(prompt.tools or prompt.namespaces or prompt.tool_namespaces)
    sections: list[Section] = []
    # Each section ends in a line break before a '#', or in a letter before one: no token spans such a cut.
    if instructions:
        text = "# Instructions\n\n" + instructions + ("\n\n" if has_tools or response_format else "")
        sections.append(Section(("developer text", text), len(text), partial(str, text)))
    if has_tools:
        keys = tuple(tool.key for tool in prompt.tools)
        namespaces = tuple(sorted(prompt.namespaces.items()))
        described = tuple(sorted(prompt.tool_namespaces.items()))
        size = 2 * sum(map(len, keys)) + sum(len(text) for _, text in namespaces + described)
        sections.append(Section(("tools", keys, namespaces, described), size, partial(
            _tools_section, declarations, prompt.tools, prompt.namespaces, prompt.tool_namespaces)))
    if response_format is not None:
        text = ("\n\n" if has_tools else "") + _response_format_section(response_format)
        sections.append(Section(("response format", text), len(text), partial(str, text)))
    return sections


def _tools_section(declarations: ToolDeclarations, tools: Sequence[FunctionTool], namespaces: Mapping[str, str],
                   tool_namespaces: Mapping[str, str]) -> str:
    """`# Tools ... } // namespace functions` (tools/typescript.py; tool text was checked for long runs), and
    beside `functions` the other namespaces (the client's namespace tools, MCP servers'), all in name order as
    openai-harmony writes them."""
    functions = [tool for tool in tools if tool.namespace is None]
    if not namespaces and not tool_namespaces:
        return declarations.section(functions)
    sections = dict(namespaces)
    if functions:
        sections["functions"] = declarations.section(functions).removeprefix("# Tools\n\n")
    for name, description in tool_namespaces.items():
        members = [declarations.declaration(tool) for tool in tools if tool.namespace == name]
        sections[name] = typescript.namespace_section(name, description, members)
    return "# Tools\n\n" + "\n\n".join(sections[name] for name in sorted(sections))


def _response_format_section(response_format: ResponseFormat) -> str:
    lines = ["# Response Formats", "", f"## {response_format.name}", ""]
    if response_format.description:
        lines.append(f"// {response_format.description}")
    lines.append(json.dumps(response_format.schema, separators=(",", ":"), ensure_ascii=False))
    return "\n".join(lines)
