"""The 2026 Responses dialect that Codex speaks, end to end with the openai SDK: namespace and custom (freeform)
tools, built-in tools nobody runs here, and images in tool outputs (issue 17)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import llguidance
import pytest

from parsers.events import ItemKind, ItemStarted
from parsers.stream import OutputParser
from proxy.engines.base import OutputConstraint
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import scripted_engine
from proxy.engines.upstream.constraints import GuidedDecoding
from proxy.responses.request.content import IMAGE_NOTE, USER_IMAGE_NOTE
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.grammars import session_matchers
from tests.test_e2e_chat import ANSWER, client_for
from tests.test_mcp_loop import validate_events, validate_response
from tools.definitions import ToolChoice, make_tool
from tools.freeform import Freeform

IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
VIEW_CALL = {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": '{"path":"a.png"}'}


def post(server: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, **body}, timeout=30)


def test_an_image_in_a_tool_output_becomes_a_note(serve: Callable[..., LiveServer], vocab: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER]))
    server = serve(engine=engine)
    output = {"type": "function_call_output", "call_id": "call_1",
              "output": [{"type": "input_text", "text": "Here it is:"}, IMAGE]}
    history = [{"role": "user", "content": "Look at a.png"}, VIEW_CALL, output]
    with caplog.at_level(logging.INFO, logger="harmony_proxy"):
        first = client_for(server).responses.create(model=MODEL, input=history, store=False)
    assert first.status == "completed"
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert f"<|message|>Here it is:\n{IMAGE_NOTE}<|end|>" in prompt and "base64" not in prompt
    assert any("image in a tool output" in record.message for record in caplog.records)
    # the image stays in the client's history: the next turn goes on too
    second = post(server, {"input": [*history, {"role": "user", "content": "And now?"}]})
    assert second.status_code == 200, second.text
    validate_response(second.json())


def test_an_image_in_a_user_message_becomes_a_note(serve: Callable[..., LiveServer], vocab: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER]))
    server = serve(engine=engine)
    message = {"role": "user", "content": [{"type": "input_text", "text": "What is in this picture?"}, IMAGE]}
    with caplog.at_level(logging.WARNING, logger="harmony_proxy"):
        first = client_for(server).responses.create(model=MODEL, input=[message], store=True)
    assert first.status == "completed"
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert f"<|start|>user<|message|>What is in this picture?\n{USER_IMAGE_NOTE}<|end|>" in prompt
    assert "base64" not in prompt and "iVBOR" not in prompt
    assert any("input[0].content[1]: an image in a user message was replaced" in record.getMessage()
               for record in caplog.records if record.levelno == logging.WARNING)
    # the image is kept as sent (input_items), and a later turn that continues from it goes on
    listed = httpx.get(f"{server.base_url}/v1/responses/{first.id}/input_items", timeout=30).json()["data"]
    assert listed[0]["content"][1]["image_url"] == IMAGE["image_url"]
    second = post(server, {"previous_response_id": first.id, "input": "And now?"})
    assert second.status_code == 200, second.text
    assert USER_IMAGE_NOTE in vocab.decode(engine.requests[1].prompt_token_ids)


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "assistant", "content": [IMAGE]}, "input[0].content[0]"),  # an assistant writes no images
    ({"role": "developer", "content": [IMAGE]}, "input[0].content[0]"),
    ({"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}, "input[0].content[0]"),
])
def test_other_content_parts_are_still_refused(serve: Callable[..., LiveServer], message: dict[str, Any],
                                               param: str) -> None:
    response = post(serve(completions=[ANSWER]), {"input": [message]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_content" and error["param"] == param
    assert "text only" in error["message"]


# -- namespace tools ---------------------------------------------------------------------------------------------------

SEARCH = {"type": "function", "name": "search", "description": "Search the docs.",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}
DOCS = {"type": "namespace", "name": "mcp__docs__", "description": "Tools in the mcp__docs__ namespace.",
        "tools": [SEARCH]}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent.",
     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}},
    {**SEARCH, "description": "A member of the same name in another namespace."}]}
NAMESPACED_CALL = ("<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary "
                   'to=mcp__docs__.search <|constrain|>json<|message|>{"q":"harmony"}<|call|>')


def validated(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events, checked against the openai SDK's types (`name` on function_call_arguments.done is the server's
    long-standing extra, not in the SDK's type: left out of the check)."""
    validate_events([{k: v for k, v in event.items() if k != "name" or event["type"] !=
                      "response.function_call_arguments.done"} for event in events])
    return events


def stream(server: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.base_url + "/v1/responses", json={"model": MODEL, "stream": True, **body},
                      timeout=30) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]


def test_namespace_tools_are_declared_as_namespaces_and_called_by_namespace_and_name(
        serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [NAMESPACED_CALL, ANSWER]))
    server = serve(engine=engine)
    events = stream(server, {"input": "Find harmony in the docs.", "tools": [EXEC, DOCS, AGENTS]})
    validated(events)  # the openai SDK's types, no field they do not know
    response = events[-1]["response"]
    call = response["output"][1]
    assert call == {"id": call["id"], "type": "function_call", "status": "completed", "call_id": call["call_id"],
                    "name": "search", "namespace": "mcp__docs__", "arguments": '{"q":"harmony"}'}
    assert [tool["type"] for tool in response["tools"]] == ["function", "namespace", "namespace"]
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert ("## mcp__docs__\n\n// Tools in the mcp__docs__ namespace.\nnamespace mcp__docs__ {\n\n"
            "// Search the docs.\ntype search = (_: {\nq: string,\n}) => any;\n\n} // namespace mcp__docs__") in prompt
    assert "namespace multi_agent_v1 {" in prompt and "namespace functions {" in prompt
    assert prompt.index("## functions") < prompt.index("## mcp__docs__") < prompt.index("## multi_agent_v1")
    # the call and its output go back as Codex sends them: the call re-rendered as the model wrote it
    history = [{"role": "user", "content": "Find harmony in the docs."},
               {k: v for k, v in call.items() if k not in ("id", "status")},
               {"type": "function_call_output", "call_id": call["call_id"], "output": "3 pages"}]
    second = post(server, {"input": history, "tools": [EXEC, DOCS, AGENTS]})
    assert second.status_code == 200, second.text
    prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert ('<|start|>assistant<|channel|>commentary to=mcp__docs__.search <|constrain|>json<|message|>{"q":"harmony"}'
            "<|call|><|start|>mcp__docs__.search to=assistant<|channel|>commentary<|message|>3 pages<|end|>") in prompt


def test_additional_tools_items_offer_their_tools(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [NAMESPACED_CALL]))
    client = client_for(serve(engine=engine))
    response = client.responses.create(model=MODEL, tools=[EXEC], input=[
        {"type": "additional_tools", "role": "developer", "tools": [DOCS, EXEC, {"type": "web_search"}]},
        {"role": "user", "content": "Find harmony in the docs."}])
    call = response.output[1]
    assert (call.type, call.name, call.namespace) == ("function_call", "search", "mcp__docs__")
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert "namespace mcp__docs__ {" in prompt and prompt.count("type exec_command") == 1  # declared again: once
    assert "## browser" not in prompt
    assert [tool.type for tool in response.tools] == ["function"]


def test_additional_tools_of_a_stored_chain_are_offered_again(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER, NAMESPACED_CALL]))
    client = client_for(serve(engine=engine))
    first = client.responses.create(model=MODEL, input=[
        {"type": "additional_tools", "role": "developer", "tools": [DOCS]}, {"role": "user", "content": "Hi"}])
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="Find harmony in the docs.")
    call = second.output[1]
    assert (call.type, call.name, call.namespace) == ("function_call", "search", "mcp__docs__")
    assert "namespace mcp__docs__ {" in vocab.decode(engine.requests[1].prompt_token_ids)


def test_the_mock_calls_a_namespace_tool_and_reads_its_result(serve: Callable[..., LiveServer]) -> None:
    server = serve()  # the mock engine
    client = client_for(server)
    first = client.responses.create(model=MODEL, input="Please use search.", tools=[DOCS], tool_choice="required")
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.name, call.namespace) == ("search", "mcp__docs__") and json.loads(call.arguments)["q"]
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[DOCS], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "3 pages"}])
    assert "mcp__docs__.search returned: 3 pages" in second.output_text


@pytest.mark.parametrize(("tools", "param", "said"), [
    ([{**DOCS, "name": "functions"}], "tools[0].name", "reserved"),
    ([{**DOCS, "name": "mcp.docs"}], "tools[0].name", "Invalid namespace name"),
    ([DOCS, {**DOCS, "description": "again"}], "tools[1].tools[0].name", "declared twice in namespace"),
    ([{**DOCS, "tools": [{"type": "file_search"}]}], "tools[0].tools[0].type", "'file_search'"),
    ([{**DOCS, "tools": [{**SEARCH, "async": True}]}], "tools[0].tools[0].async", "Asynchronous"),
    ([{"type": "namespace", "name": "x"}], "tools[0].tools", "Missing required"),
])
def test_malformed_namespace_tools_are_400s(serve: Callable[..., LiveServer], tools: list[dict[str, Any]],
                                           param: str, said: str) -> None:
    response = post(serve(completions=[ANSWER]), {"input": "Hi", "tools": tools})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and said in response.json()["error"]["message"]


def test_the_parser_reads_a_call_to_a_client_namespace(vocab: Any) -> None:
    tokens = vocab.encode_harmony(NAMESPACED_CALL)
    offered = OutputParser(vocab, tool_namespaces=frozenset({"mcp__docs__"})).feed(tokens)
    assert ItemStarted(1, ItemKind.TOOL_CALL, "search", None, "mcp__docs__") in offered
    assert not any(isinstance(event, ItemStarted) and event.kind is ItemKind.TOOL_CALL
                   for event in OutputParser(vocab).feed(tokens))  # not offered: dropped, never a `functions` call


# -- custom (freeform) tools -------------------------------------------------------------------------------------------

APPLY_PATCH_GRAMMAR = (Path(__file__).resolve().parent.parent / "fixtures" / "codex" / "apply_patch.lark").read_text()
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Use the `apply_patch` tool to edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_GRAMMAR}}  # as Codex has it
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello, world!\n*** End Patch\n"
PATCH_CALL = ("<|channel|>analysis<|message|>Write the file.<|end|><|start|>assistant<|channel|>commentary "
              f"to=functions.apply_patch<|message|>{PATCH}<|call|>")


def in_grammar(vocab: Any, definition: str, text: str) -> bool:
    """Whether `text` is a whole sentence of the Lark grammar (llguidance, fed its tokens)."""
    matcher = llguidance.LLMatcher(session_matchers(vocab).tokenizer(),
                                   llguidance.LLMatcher.grammar_from_lark(definition), log_level=0)
    return matcher.consume_tokens(vocab.encode(text)) and matcher.is_accepting()


def test_a_custom_tool_call_streams_its_raw_input(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [PATCH_CALL, ANSWER]))
    server = serve(engine=engine)
    events = validated(stream(server, {"input": "Write hello.txt.", "tools": [EXEC, APPLY_PATCH]}))
    call = events[-1]["response"]["output"][1]
    assert call == {"id": call["id"], "type": "custom_tool_call", "call_id": call["call_id"], "name": "apply_patch",
                    "input": PATCH}
    kinds = [event["type"] for event in events]
    assert "response.custom_tool_call_input.delta" in kinds and "response.function_call_arguments.delta" not in kinds
    done = next(event for event in events if event["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == PATCH and done["item_id"] == call["id"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta") == PATCH
    assert events[-1]["response"]["tools"][1] == APPLY_PATCH
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert ("// Use the `apply_patch` tool to edit files.\n// This tool takes raw text, not JSON: write its input as "
            "the message, as is.\n// Its input follows this Lark grammar:\n// start: begin_patch hunk+ end_patch\n") \
        in prompt and "type apply_patch = (_: string) => any;" in prompt
    # the call and its output go back as Codex sends them: the input written as the model wrote it
    history = [{"role": "user", "content": "Write hello.txt."},
               {k: v for k, v in call.items() if k != "id"},
               {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}]
    second = client_for(server).responses.create(model=MODEL, input=history, tools=[EXEC, APPLY_PATCH])
    assert second.output_text == "It is 18C."
    assert (f"<|start|>assistant<|channel|>commentary to=functions.apply_patch<|message|>{PATCH}<|call|>"
            "<|start|>functions.apply_patch to=assistant<|channel|>commentary<|message|>Done!<|end|>") \
        in vocab.decode(engine.requests[1].prompt_token_ids)


@pytest.mark.parametrize("body", [
    PATCH,  # within the grammar: written as planned
    "*** Begin Patch\n*** Add File: hello.txt\n+Hello, world!\nno plus sign on this line\n*** End Patch\n",
    "*** Begin Patch\n*** Frobnicate File: hello.txt\n+Hello\n*** End Patch\n",
])
def test_the_mock_writes_apply_patch_within_codex_grammar(serve: Callable[..., LiveServer], vocab: Any,
                                                          body: str) -> None:
    client = client_for(serve())  # the mock engine: it follows llguidance's masks
    response = client.responses.create(model=MODEL, tools=[EXEC, APPLY_PATCH], input=f"Please use apply_patch:\n{body}")
    call = next(item for item in response.output if item.type == "custom_tool_call")
    assert call.name == "apply_patch"
    assert in_grammar(vocab, APPLY_PATCH_GRAMMAR, call.input), call.input  # the body cannot leave the grammar
    assert (call.input == body) == in_grammar(vocab, APPLY_PATCH_GRAMMAR, body)
    validate_response(response.model_dump(mode="json", exclude_unset=True))


def test_regex_and_text_custom_tools_and_a_named_custom_tool_choice(serve: Callable[..., LiveServer],
                                                                   vocab: Any) -> None:
    engine = Recording(mock_engine(vocab, matchers=session_matchers(vocab)))
    client = client_for(serve(engine=engine))
    digits = {"type": "custom", "name": "pin",
              "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]{4}"}}
    notes = {"type": "custom", "name": "note", "format": {"type": "text"}}
    response = client.responses.create(model=MODEL, tools=[digits, notes], input="Set the pin 12ab34.",
                                       tool_choice={"type": "custom", "name": "pin"})
    call = next(item for item in response.output if item.type == "custom_tool_call")
    assert call.name == "pin" and re.fullmatch("[0-9]{4}", call.input), call.input
    assert response.tool_choice.type == "custom" and response.tool_choice.name == "pin"
    grammar = engine.requests[0].constraint.grammar
    assert grammar is not None and "a call to pin required" in grammar.summary and not grammar.structural_tag_gaps
    free = client.responses.create(model=MODEL, tools=[digits, notes], input="Use note: buy milk")
    call = next(item for item in free.output if item.type == "custom_tool_call")
    assert (call.name, call.input) == ("note", "buy milk")


def test_a_custom_tool_in_a_namespace(serve: Callable[..., LiveServer], vocab: Any) -> None:
    tools = [{"type": "namespace", "name": "editor", "description": "Editing.", "tools": [APPLY_PATCH]}]
    engine = Recording(mock_engine(vocab, matchers=session_matchers(vocab)))
    response = client_for(serve(engine=engine)).responses.create(model=MODEL, tools=tools,
                                                                 input=f"Please use apply_patch:\n{PATCH}")
    call = next(item for item in response.output if item.type == "custom_tool_call")
    assert (call.name, call.namespace, call.input) == ("apply_patch", "editor", PATCH)
    grammar = engine.requests[0].constraint.grammar
    assert grammar is not None and '" to=editor.apply_patch"' in grammar.lark and "%lark {" in grammar.lark
    assert grammar.structural_tag_gaps == "the Lark grammar of custom tool apply_patch"  # said for xgrammar engines


@pytest.mark.parametrize(("tool", "param"), [
    ({**APPLY_PATCH, "format": {"type": "grammar", "syntax": "lark", "definition": "start: }"}},
     "tools[0].format.definition"),
    ({**APPLY_PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": "("}},
     "tools[0].format.definition"),
    ({**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}, "tools[0].format.syntax"),
])
def test_custom_tools_with_a_bad_grammar_are_400s(serve: Callable[..., LiveServer], tool: dict[str, Any],
                                                  param: str) -> None:
    response = post(serve(completions=[ANSWER]), {"input": "Hi", "tools": [tool]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_upstreams_get_the_grammar_in_their_dialect_and_say_what_it_leaves_free() -> None:
    tool = make_tool("apply_patch", "", None, None, "tools[0]", freeform=Freeform("lark", APPLY_PATCH_GRAMMAR))
    constraint = OutputConstraint((tool,), ToolChoice("required"))
    fields, free = GuidedDecoding("vllm", "llguidance").fields(constraint)
    assert "%lark {\n" + APPLY_PATCH_GRAMMAR in fields["structured_outputs"]["grammar"] and free == ""
    fields, free = GuidedDecoding("sglang", "xgrammar").fields(constraint)  # structural tags take no Lark
    assert fields["response_format"]["type"] == "structural_tag" and "apply_patch" in free


@pytest.mark.parametrize("body", [
    {"input": [{"type": "additional_tools", "role": "developer", "tools": [1]}]},
    {"input": [{"type": "additional_tools", "role": "developer", "tools": [{"type": "file_search"}]}]},
    {"input": [{"type": "additional_tools", "role": "user", "tools": []}]},
    {"input": "Hi", "tools": [{"type": "namespace", "name": "x", "description": "d", "tools": "many"}]},
    {"input": "Hi", "tools": [{"type": "namespace", "name": "x", "description": "d", "tools": [[]]}]},
    {"input": "Hi", "tools": [{"type": "custom", "name": "p", "format": {"type": "grammar"}}]},
    {"input": "Hi", "tools": [{"type": "custom", "name": "p q"}]},
    {"input": "Hi", "tools": [{"type": "custom", "name": "p"}], "tool_choice": {"type": "custom", "name": "q"}},
    {"input": "Hi", "tools": [{"type": "custom", "name": "p"}], "tool_choice": {"type": "function", "name": "p"}},
    {"input": [{"type": "custom_tool_call_output", "call_id": "call_9", "output": "x"}]},
    {"input": [{"role": "user", "content": "Hi"}, {**VIEW_CALL, "namespace": "a.b"}]},
    {"input": [{"role": "user", "content": "Hi"},
               {"type": "custom_tool_call", "call_id": "c", "name": "p", "input": 3}]},
])
def test_malformed_dialect_requests_are_400s(serve: Callable[..., LiveServer], body: dict[str, Any]) -> None:
    response = post(serve(completions=[ANSWER]), body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"]
