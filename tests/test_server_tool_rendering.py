"""Harmony text for server-side tools, compared token for token with openai-harmony: the system message with
gpt-oss's built-in browser and python tools, MCP servers' tools as namespaces, tool results and calls."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from openai_harmony import (
    Author,
    DeveloperContent,
    Message,
    RenderOptions,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from parsers.conversation import Prompt, UserMessage
from parsers.opening_messages import EFFORTS, KNOWLEDGE_CUTOFF
from parsers.render import Renderer
from parsers.vocab import Vocab
from proxy.server_tools.builtin import BuiltinTool, recognize
from proxy.server_tools.listing import McpTool, ServerTools
from proxy.server_tools.rendering import (
    call_tokens,
    function_tool,
    functions_section,
    harmony_schema,
    label_error,
    result_tokens,
    tools_section,
)
from tools import typescript
from tools.definitions import ToolError
from tools.typescript import namespace_section

# What MCP servers list: FastMCP's schemas carry a title per property and for the whole, and `default: null`.
FORECAST = McpTool("get_forecast", "Get the weather forecast for a city.\nDays default to one.", {
    "type": "object", "title": "get_forecastArguments", "required": ["city"],
    "properties": {"city": {"title": "City", "type": "string", "description": "A city name"},
                   "days": {"title": "Days", "type": "integer", "default": None},
                   "units": {"title": "Units", "enum": ["metric", "imperial"], "type": "string", "default": "metric"}},
})
ALERTS = McpTool("alerts", "Current alerts.", {"type": "object", "properties": {}})
WEATHER = [FORECAST, ALERTS]


@pytest.fixture(scope="module")
def renderer(vocab: Vocab) -> Renderer:
    return Renderer(vocab)


def library_system(vocab: Vocab, effort: str, with_tools: bool, builtin: tuple[str, ...]) -> list[int]:
    content = SystemContent.new().with_reasoning_effort(EFFORTS[effort]).with_knowledge_cutoff(KNOWLEDGE_CUTOFF)
    if "browser" in builtin:
        content = content.with_browser_tool()
    if "python" in builtin:
        content = content.with_python_tool()
    message = Message.from_role_and_content(Role.SYSTEM, content)
    return vocab.encoding.render(message, RenderOptions(conversation_has_function_tools=with_tools))


@pytest.mark.parametrize("builtin", [(), ("browser",), ("python",), ("browser", "python"), ("python", "browser")])
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_the_system_message_declares_builtin_tools_as_openai_harmony(
        vocab: Vocab, renderer: Renderer, effort: str, with_tools: bool, builtin: tuple[str, ...]) -> None:
    ours = list(renderer.system_message(effort, with_tools, builtin))
    assert ours == library_system(vocab, effort, with_tools, tuple(sorted(builtin)))
    text = vocab.decode(ours)
    assert ("namespace browser {" in text) is ("browser" in builtin)
    assert ("## python\n\nUse this tool to execute Python code" in text) is ("python" in builtin)


def test_without_builtin_tools_the_prompt_is_as_before(vocab: Vocab, renderer: Renderer) -> None:
    prompt = renderer.render(Prompt([UserMessage("hi")], reasoning_effort="low"))
    system = library_system(vocab, "low", False, ())
    assert prompt[: len(system)] == system
    assert list(renderer.system_message("low", False)) == system


def library_developer(vocab: Vocab, namespaces: list[ToolNamespaceConfig]) -> str:
    content = DeveloperContent.new()
    for namespace in namespaces:
        content = content.with_tools(namespace)
    tokens = vocab.encoding.render(Message.from_role_and_content(Role.DEVELOPER, content))
    return vocab.decode(tokens).removeprefix("<|start|>developer<|message|>").removesuffix("<|end|>")


def library_namespace(name: str, description: str | None, tools: list[McpTool]) -> ToolNamespaceConfig:
    return ToolNamespaceConfig(name=name, description=description, tools=[
        ToolDescription.new(tool.name, tool.description, harmony_schema(tool.input_schema)) for tool in tools])


def declarations(tools: list[McpTool]) -> list[str]:
    checked = [function_tool(tool) for tool in tools]
    return [typescript.declaration(tool.name, tool.description, tool.parameters) for tool in checked]


@pytest.mark.parametrize("description", [None, "Weather forecasts.", "Two lines:\nof description."])
def test_an_mcp_server_is_a_namespace_as_the_library_writes_one(vocab: Vocab, description: str | None) -> None:
    ours = tools_section({"weather": namespace_section("weather", description, declarations(WEATHER))})
    assert ours == library_developer(vocab, [library_namespace("weather", description, WEATHER)])
    assert "namespace weather {" in ours and "} // namespace weather" in ours and "City" not in ours
    assert vocab.encode(ours) == vocab.encoding.encode(ours, allowed_special=set())


def test_namespaces_sit_beside_functions_in_the_librarys_order(vocab: Vocab) -> None:
    function = ToolDescription.new("lookup", "Look a word up.", {"type": "object", "properties": {
        "word": {"type": "string"}}, "required": ["word"]})
    sections = {
        "functions": functions_section([typescript.declaration(function.name, function.description,
                                                               function.parameters)]),
        "weather": namespace_section("weather", "Weather.", declarations(WEATHER)),
        "atlas": namespace_section("atlas", None, declarations([ALERTS])),
    }
    library = library_developer(vocab, [
        ToolNamespaceConfig(name="functions", description=None, tools=[function]),
        library_namespace("weather", "Weather.", WEATHER), library_namespace("atlas", None, [ALERTS])])
    assert tools_section(sections) == library
    assert library.index("## atlas") < library.index("## functions") < library.index("## weather")


def test_a_namespace_without_tools_is_its_description_alone(vocab: Vocab) -> None:
    assert tools_section({"notes": namespace_section("notes", "Just notes.\nNothing to call.", [])}) == \
        library_developer(vocab, [ToolNamespaceConfig(name="notes", description="Just notes.\nNothing to call.",
                                                      tools=[])])


def test_schema_trimming_keeps_property_names_and_real_defaults() -> None:
    schema = {"type": "object", "title": "T", "properties": {
        "title": {"type": "string", "title": "Title", "default": None},
        "tags": {"type": "array", "items": {"title": "Tag", "type": "string"}},
        "mode": {"anyOf": [{"type": "string", "title": "A"}, {"type": "null"}], "default": "fast"},
        "nested": {"$ref": "#/$defs/N"}}, "$defs": {"N": {"title": "N", "type": "object", "properties": {}}}}
    assert harmony_schema(schema) == {"type": "object", "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": "fast"},
        "nested": {"$ref": "#/$defs/N"}}, "$defs": {"N": {"type": "object", "properties": {}}}}


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize(("tool", "problem"), [
    (McpTool("has space", "", {"type": "object"}), "cannot be called"),
    (McpTool("a/b", "", {"type": "object"}), "cannot be called"),
    (McpTool("deep", "", nested(60)), "nested more than"),
    (McpTool("invalid", "", {"type": "object", "properties": {"x": {"type": 3}}}), "Invalid JSON Schema"),
])
def test_mcp_tools_that_cannot_be_offered_are_refused(tool: McpTool, problem: str) -> None:
    with pytest.raises(ToolError, match=problem):
        function_tool(tool)


@pytest.mark.parametrize(("label", "problem"), [
    ("weather", None), ("my-server_2", None), ("functions", "reserved"), ("Browser", "reserved"),
    ("python", "reserved"),
    ("a.b", "letters, digits"), ("", "letters, digits"), ("x" * 65, "letters, digits"), (None, "letters, digits"),
])
def test_server_labels_must_make_namespaces(label: object, problem: str | None) -> None:
    error = label_error(label)
    assert (error is None) if problem is None else (error is not None and problem in error)


@pytest.mark.parametrize(("recipient", "channel"), [
    ("weather.get_forecast", "commentary"), ("browser.search", "analysis"), ("python", "analysis"),
    ("functions.lookup", "commentary")])
# Long outputs are encoded in pieces (over 8192 characters here); runs of over 1,000 characters without a break are
# the one place where Vocab.encode departs from the library, on purpose (parsers/vocab.py).
@pytest.mark.parametrize("output", ["Sunny, 21C.", "", "spells <|end|> and <|call|> as text\n" * 3,
                                    "L1: a line of a page\nwith words " * 800])
def test_results_are_written_as_the_library_writes_tool_messages(vocab: Vocab, recipient: str, channel: str,
                                                                 output: str) -> None:
    library = Message.from_author_and_content(Author.new(Role.TOOL, recipient), output) \
        .with_recipient("assistant").with_channel(channel)
    assert result_tokens(vocab, recipient, channel, output) == vocab.encoding.render(library)


def test_calls_are_written_as_the_model_writes_them(vocab: Vocab) -> None:
    assert vocab.decode(call_tokens(vocab, "weather.get_forecast", "commentary", '{"city":"Paris"}')) == (
        '<|start|>assistant<|channel|>commentary to=weather.get_forecast <|constrain|>json<|message|>'
        '{"city":"Paris"}<|call|>')
    assert vocab.decode(call_tokens(vocab, "python", "analysis", "print(6 * 7)", "code")) == (
        "<|start|>assistant<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>")
    assert vocab.decode(call_tokens(vocab, "browser.open", "analysis", '{"id": 1}', None)) == (
        '<|start|>assistant<|channel|>analysis to=browser.open<|message|>{"id": 1}<|call|>')
    # The function form is the renderer's own history tool call, token for token.
    ours = call_tokens(vocab, "functions.lookup", "commentary", '{"word":"x"}')
    assert ours == vocab.encode_harmony(
        '<|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"word":"x"}<|call|>')


def listed(name: str | None, *tools: tuple[str, dict[str, Any]]) -> ServerTools:
    return ServerTools(name, None, tuple(McpTool(tool, "", schema) for tool, schema in tools))


CODE = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
SCRIPT = {"type": "object", "properties": {"timeout": {"type": "integer"}, "script": {"type": "string"}},
          "required": ["timeout", "script"]}


@pytest.mark.parametrize(("server", "found"), [
    (listed("browser", ("search", {}), ("open", {}), ("find", {})),
     [BuiltinTool("browser", "u", ("search", "open", "find"))]),
    (listed(None, ("find", {}), ("open", {}), ("search", {}), ("other", {})),  # no name: the tools tell
     [BuiltinTool("browser", "u", ("search", "open", "find"))]),
    (listed("browser", ("search", {}), ("open", {})), []),  # not all of the functions the model is shown
    (listed("python", ("python", CODE)), [BuiltinTool("python", "u", ("python",), "code")]),
    (listed("Python", ("run", SCRIPT)), [BuiltinTool("python", "u", ("run",), "script")]),  # its only tool
    (listed("python", ("run", SCRIPT), ("lint", CODE)), []),
    (listed("weather", ("get_forecast", {})), []),
    (listed("both", ("search", {}), ("open", {}), ("find", {}), ("python", CODE)),
     [BuiltinTool("browser", "u", ("search", "open", "find")), BuiltinTool("python", "u", ("python",), "code")]),
])
def test_tool_servers_are_recognized_by_their_tools(server: ServerTools, found: list[BuiltinTool]) -> None:
    assert recognize("u", server) == found


def test_model_recipients_map_to_the_servers_tools() -> None:
    browser = BuiltinTool("browser", "u", ("search", "open", "find"))
    python = BuiltinTool("python", "u", ("run",), "script")
    assert [browser.server_tool(r) for r in ("browser.search", "browser.find", "browser.click", "python")] == \
        ["search", "find", None, None]
    assert [python.server_tool(r) for r in ("python", "browser.search", "python.run")] == ["run", None, None]


def test_every_builtin_combination_is_cached_once(renderer: Renderer) -> None:
    for builtin in itertools.permutations(("browser", "python")):
        assert renderer.system_message("medium", True, builtin) is renderer.system_message("medium", True,
                                                                                           builtin[::-1])
