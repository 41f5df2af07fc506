"""A conversation as Harmony sees it, whichever OpenAI API it came from.

Chat Completions messages and Responses input items both translate into this list of plain items; the
renderer turns the list into prompt tokens. Keeping one form means one set of rendering rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.definitions import FunctionTool, ResponseFormat


@dataclass(frozen=True)
class Instructions:
    """A system or developer message: the developer instructions of Harmony."""

    text: str


@dataclass(frozen=True)
class UserMessage:
    text: str


@dataclass(frozen=True)
class Reasoning:
    """The assistant's chain of thought (analysis channel). `tokens`, when known, are its body's token ids as the
    model generated them (from a sealed reasoning item): rendered as they are, in place of the text."""

    text: str
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AssistantMessage:
    """Visible assistant text: a final answer, or a commentary preamble written before tool calls."""

    text: str
    preamble: bool = False


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON; a custom tool's raw input when `freeform`
    namespace: str | None = None  # a namespace tool's (the client's own, besides `functions`)
    freeform: bool = False  # a custom tool's call: its input written as is, not as JSON

    @property
    def recipient(self) -> str:
        return f"{self.namespace or 'functions'}.{self.name}"


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    name: str
    output: str
    namespace: str | None = None

    @property
    def recipient(self) -> str:
        return f"{self.namespace or 'functions'}.{self.name}"


@dataclass(frozen=True)
class ServerToolCall:
    """A call the server ran for the model itself: to an MCP server's namespace (`weather.get_forecast`) or to a
    built-in tool (`browser.search`, `python`), written back as the model writes it. `content_type` "json" is
    written ` <|constrain|>json`, "code" ` code` (the python tool's code), None nothing."""

    recipient: str
    arguments: str
    channel: str = "commentary"
    content_type: str | None = "json"


@dataclass(frozen=True)
class ServerToolResult:
    """What such a call returned, as the tool's message to the assistant on the call's channel."""

    recipient: str
    output: str
    channel: str = "commentary"


Item = (Instructions | UserMessage | Reasoning | AssistantMessage | ToolCall | ToolResult | ServerToolCall
        | ServerToolResult)


@dataclass
class Prompt:
    items: list[Item]
    tools: list[FunctionTool] = field(default_factory=list)  # offered to the model (none when tool_choice=none)
    reasoning_effort: str = "medium"
    response_format: ResponseFormat | None = None
    builtin_tools: tuple[str, ...] = ()  # gpt-oss's built-in tools (browser, python), declared in the system message
    # Tool namespaces beside `functions` in the developer message (MCP servers): name -> its `## name` section text.
    namespaces: dict[str, str] = field(default_factory=dict)
    # The client's namespace tools: name -> description; their members are in `tools`, with their namespace.
    tool_namespaces: dict[str, str] = field(default_factory=dict)
