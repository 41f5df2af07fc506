"""The 2026 Responses dialect that Codex speaks, end to end with the openai SDK: namespace and custom (freeform)
tools, built-in tools nobody runs here, and images in tool outputs (issue 17)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from parsers.events import ItemKind, ItemStarted
from parsers.stream import OutputParser
from proxy.engines.scripted import scripted_engine
from proxy.responses.request import IMAGE_NOTE
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, client_for
from tests.test_mcp_loop import validate_events, validate_response

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


def test_an_image_in_a_user_message_is_still_refused(serve: Callable[..., LiveServer]) -> None:
    response = post(serve(completions=[ANSWER]), {"input": [{"role": "user", "content": [IMAGE]}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_content" and error["param"] == "input[0].content[0]"
    assert "text only" in error["message"]


# -- namespace tools ----------------------------------------------------------------------------------------------------

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
    ([{"type": "namespace", "name": "x", "tools": []}], "tools[0].description", "Missing required"),
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
