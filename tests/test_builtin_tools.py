"""gpt-oss's built-in browser and python tools, run through `--tool-server` MCP servers (tests/mcp_servers.py):
`web_search_preview` / `code_interpreter` requests, the `web_search_call` and `code_interpreter_call` items and
events (checked against the openai SDK's types), the Harmony the model sees, and the parser's server calls."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from parsers.events import ItemDone, ItemKind, ItemStarted
from parsers.stream import OutputParser
from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.mcp_servers import PAGES, Running
from tests.test_e2e_chat import client_for
from tests.test_mcp_loop import ANSWER, kinds, stream, validate_events, validate_response

SEARCH = ('<|channel|>analysis<|message|>Search first.<|end|><|start|>assistant<|channel|>analysis to=browser.search '
          '<|constrain|>json<|message|>{"query":"weather paris"}<|call|>')
OPEN = '<|channel|>analysis to=browser.open code<|message|>{"id":"https://weather.example/paris"}<|call|>'
FIND = '<|channel|>analysis to=browser.find<|message|>{"pattern":"Rain"}<|call|>'
PYTHON = ("<|channel|>analysis<|message|>Compute.<|end|><|start|>assistant<|channel|>analysis to=python code"
          "<|message|>print(6 * 7)<|call|>")


def test_web_search_runs_gpt_oss_browser_through_the_tool_server(serve: Callable[..., LiveServer], vocab: Any,
                                                                 browser: Running) -> None:
    engine = Recording(scripted_engine(vocab, [SEARCH, OPEN, FIND, ANSWER]))
    server = serve(engine=engine, tool_servers=(browser.url,))
    events = stream(server, {"input": "Weather in Paris?", "tools": [{"type": "web_search_preview"}]})
    validate_events(events)
    response = events[-1]["response"]
    assert [item["type"] for item in response["output"]] == ["reasoning", "web_search_call", "web_search_call",
                                                             "web_search_call", "reasoning", "message"]
    searches = response["output"][1:4]
    assert [item["action"] for item in searches] == [
        {"type": "search", "query": "weather paris"},
        {"type": "open_page", "url": "https://weather.example/paris"},
        {"type": "find_in_page", "pattern": "Rain", "url": ""}]
    assert all(item["status"] == "completed" and item["id"].startswith("ws_") for item in searches)
    one_search = ["response.output_item.added", "response.web_search_call.in_progress",
                  "response.web_search_call.searching", "response.web_search_call.completed",
                  "response.output_item.done"]
    types = kinds(events)
    start = types.index("response.web_search_call.in_progress") - 1
    assert types[start: start + 15] == one_search * 3
    assert response["tools"] == [{"type": "web_search_preview"}]
    # The system message declares the browser as gpt-oss knows it; results come back on the call's channel.
    first, second = (vocab.decode(request.prompt_token_ids) for request in engine.requests[:2])
    assert "# Tools\n\n## browser\n\n// Tool for browsing." in first and "namespace browser {" in first
    assert "functions" not in first
    assert second.startswith(first) and second.endswith(
        '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query":"weather paris"}<|call|>'
        "<|start|>browser.search to=assistant<|channel|>analysis<|message|>[0] Search results for `weather paris`\n"
        "**viewing lines [0 - 1]**\n\nL0: 【0†Paris forecast†weather.example】\nL1: 【1†Rome forecast†weather.example】"
        "<|end|><|start|>assistant")
    third = vocab.decode(engine.requests[2].prompt_token_ids)
    assert f"L0: {PAGES['https://weather.example/paris'][1].splitlines()[0]}" in third
    # Next turn: browsing was chain of thought of a finished turn, so the model no longer sees it.
    client = client_for(serve(engine=engine, tool_servers=(browser.url,)))
    del engine.requests[:]
    replay = client.responses.create(model=MODEL, input=[
        {"role": "user", "content": "Weather in Paris?"}, *response["output"],
        {"role": "user", "content": "Thanks!"}], tools=[{"type": "web_search_preview"}])
    assert replay.status == "completed"
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert "Search results" not in prompt and "to=browser" not in prompt and "It is sunny." in prompt


@pytest.mark.parametrize("include", [True, False])
def test_code_interpreter_runs_python_through_the_tool_server(serve: Callable[..., LiveServer], vocab: Any,
                                                              python: Running, include: bool) -> None:
    engine = Recording(scripted_engine(vocab, [PYTHON, ANSWER]))
    server = serve(engine=engine, tool_servers=(python.url,))
    body: dict[str, Any] = {"input": "6 times 7?", "tools": [{"type": "code_interpreter", "container": "cntr_1"}]}
    if include:
        body["include"] = ["code_interpreter_call.outputs"]
    events = stream(server, body)
    validate_events(events)
    ran = events[-1]["response"]["output"][1]
    assert ran["type"] == "code_interpreter_call" and ran["status"] == "completed" and ran["code"] == "print(6 * 7)"
    assert ran["container_id"] == "cntr_1" and ran["id"].startswith("ci_")
    assert ran["outputs"] == ([{"type": "logs", "logs": "42\n"}] if include else None)
    types = kinds(events)
    start = types.index("response.code_interpreter_call.in_progress") - 1
    assert types[start: start + 7] == [
        "response.output_item.added", "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta", "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting", "response.code_interpreter_call.completed",
        "response.output_item.done"]
    code = "".join(e["delta"] for e in events if e["type"] == "response.code_interpreter_call_code.delta")
    assert code == "print(6 * 7)"
    first, second = (vocab.decode(request.prompt_token_ids) for request in engine.requests)
    assert "## python\n\nUse this tool to execute Python code" in first
    assert second.endswith("<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>"
                           "<|start|>python to=assistant<|channel|>analysis<|message|>42\n<|end|><|start|>assistant")


def test_a_replayed_python_call_is_shown_while_its_tool_loop_goes_on(serve: Callable[..., LiveServer],
                                                                     vocab: Any, python: Running) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    client = client_for(serve(engine=engine, tool_servers=(python.url,)))
    client.responses.create(model=MODEL, tools=[{"type": "code_interpreter", "container": {"type": "auto"}}], input=[
        {"role": "user", "content": "6 times 7?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Compute."}]},
        {"type": "code_interpreter_call", "id": "ci_1", "status": "completed", "code": "print(6 * 7)",
         "container_id": "cntr_1", "outputs": [{"type": "logs", "logs": "42\n"}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}}])
    assert vocab.decode(engine.requests[0].prompt_token_ids).endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Compute.<|end|>"
        "<|start|>assistant<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>"
        "<|start|>python to=assistant<|channel|>analysis<|message|>42\n<|end|><|start|>assistant")


@pytest.mark.parametrize(("tool", "servers"), [
    ({"type": "web_search_preview"}, "none"),
    ({"type": "web_search"}, "none"),
    ({"type": "web_search", "external_web_access": False}, "browser"),  # Codex: no live search wanted
    ({"type": "code_interpreter", "container": {"type": "auto"}}, "none"),
    ({"type": "code_interpreter", "container": {"type": "auto"}}, "browser"),
])
def test_builtin_tools_no_tool_server_runs_are_listed_back_but_not_offered(
        serve: Callable[..., LiveServer], vocab: Any, browser: Running, tool: dict[str, Any], servers: str,
        caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER]))
    server = serve(engine=engine, tool_servers=(browser.url,) if servers == "browser" else ())
    with caplog.at_level(logging.INFO, logger="harmony_proxy"):
        reply = httpx.post(server.base_url + "/v1/responses", json={
            "model": MODEL, "input": "x", "tools": [tool], "text": {"format": {"type": "json_object"}}}, timeout=10)
    assert reply.status_code == 200, reply.text  # nor does it stand in the way of a JSON format
    assert reply.json()["tools"] == [tool]
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert "## browser" not in prompt and "## python" not in prompt
    said = [record.message for record in caplog.records if "not offered to the model" in record.message]
    assert said and repr(tool["type"]) in said[0]  # the log names the type the request used
    validate_response(reply.json())


def test_refusals_name_the_tool_type_the_request_used(serve: Callable[..., LiveServer], browser: Running) -> None:
    server = serve(completions=[ANSWER], tool_servers=(browser.url,))
    for tool in ({"type": "web_search"}, {"type": "web_search_2025_08_26"}):
        reply = httpx.post(server.base_url + "/v1/responses", timeout=10, json={
            "model": MODEL, "input": "x", "tool_choice": "required",
            "tools": [tool, {"type": "function", "name": "f", "parameters": {"type": "object"}}]})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "tool_choice"
        message = reply.json()["error"]["message"]
        assert repr(tool["type"]) in message and "web_search_preview" not in message
    reply = httpx.post(server.base_url + "/v1/responses", timeout=10, json={
        "model": MODEL, "input": "x", "tools": [{"type": "web_search", "filters": {"allowed_domains": ["a.example"]}}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools[0].filters.allowed_domains"


def test_calls_to_tools_not_offered_are_still_dropped(serve: Callable[..., LiveServer], vocab: Any,
                                                      browser: Running) -> None:
    engine = Recording(scripted_engine(vocab, [PYTHON + ANSWER]))  # python was not offered: never run
    client = client_for(serve(engine=engine, tool_servers=(browser.url,)))
    response = client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search_preview"}])
    assert [item.type for item in response.output] == ["reasoning"]  # the call was skipped; <|call|> ended the turn
    assert len(engine.requests) == 1
    validate_response(response.model_dump(mode="json", exclude_unset=True))


def test_the_parser_reports_calls_to_the_namespaces_it_was_given(vocab: Any) -> None:
    text = (SEARCH + '<|start|>assistant<|channel|>commentary to=weather.get_forecast <|constrain|>json<|message|>{}'
            "<|call|><|start|>assistant<|channel|>analysis to=container.exec<|message|>ls<|call|>")
    tokens = vocab.encode_harmony(text)
    for namespaces in (frozenset({"browser", "weather"}), frozenset()):
        whole = OutputParser(vocab, namespaces).feed(tokens)
        parser = OutputParser(vocab, namespaces)
        split = [event for token in tokens for event in parser.feed([token])]
        assert "".join(e for e in split if type(e) is str) == "".join(e for e in whole if type(e) is str)
        assert [e for e in split if type(e) is not str] == [e for e in whole if type(e) is not str]
        started = [event for event in whole if type(event) is ItemStarted]
        if namespaces:
            assert started[1:] == [ItemStarted(1, ItemKind.SERVER_CALL, "browser.search", "analysis"),
                                   ItemStarted(2, ItemKind.SERVER_CALL, "weather.get_forecast", "commentary")]
            assert ItemDone(1, True, len(vocab.encode('{"query":"weather paris"}'))) in whole
        else:
            assert [event.kind for event in started] == [ItemKind.REASONING]  # the calls are dropped, as before
        assert "ls" not in "".join(e for e in whole if type(e) is str)  # never offered: dropped either way
