"""The server-side tool loop with remote MCP tools, end to end: real MCP servers on loopback ports
(tests/mcp_servers.py), the scripted engine calling their tools, and the clients users run (the openai SDK,
openai-agents' HostedMCPTool, raw HTTP). Every event and response is checked against the openai SDK's types."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from proxy.engines.scripted import scripted_engine
from proxy.responses.request.hosted_request import ApprovalPolicy, ToolFilter
from proxy.server_tools.listing import McpTool
from proxy.telemetry.access_log import redact_body
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.mcp_servers import Running
from tests.test_e2e_chat import client_for

set_tracing_disabled(True)

SECRET = "s3cr3t-header-value-0123456789"
TOKEN = "oauth-token-abcdefghij0123"
ANSWER = "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
# Fields of the Open Responses resource that the openai SDK's Response does not declare.
OPEN_RESPONSES_ONLY = {"presence_penalty", "frequency_penalty", "store"}
_EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def call(recipient: str, arguments: str = "{}", channel: str = "commentary", reasoning: str = "Need a tool.") -> str:
    return (f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>{channel} to={recipient} "
            f"<|constrain|>json<|message|>{arguments}<|call|>")


FORECAST = call("weather.get_forecast", '{"city":"Paris"}')


def mcp_tool(server: Running, label: str = "weather", **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": server.url, **fields}


def extras(value: Any, path: str = "$") -> list[str]:
    """Fields a parsed SDK model did not declare (openai models accept and keep unknown fields)."""
    found = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{name}" for name in value.model_extra or {}]
        for name in type(value).model_fields:
            found += extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += extras(item, f"{path}[{index}]")
    return found


def validate_response(body: dict[str, Any]) -> Response:
    """The response object as the openai SDK types it, with no field the SDK does not know (but the spec's)."""
    parsed = Response.model_validate(body)
    assert [path for path in extras(parsed) if path.removeprefix("$.") not in OPEN_RESPONSES_ONLY] == []
    return parsed


def validate_events(events: list[dict[str, Any]]) -> None:
    """Each event as the SDK types it, numbered from 0, ids and indexes those of the final response."""
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        parsed = _EVENTS.validate_python(event)
        assert parsed.type == event["type"]
        unknown = [path for path in extras(parsed) if path.removeprefix("$.response.") not in OPEN_RESPONSES_ONLY]
        assert unknown == [], event
    final = validate_response(events[-1]["response"]).model_dump(mode="json", exclude_unset=True)
    for event in events:
        if "item_id" in event and event["type"] != "response.output_item.added":
            assert final["output"][event["output_index"]]["id"] == event["item_id"]
    assert final["output"] == [e["item"] for e in events if e["type"] == "response.output_item.done"]


def stream(server: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.base_url + "/v1/responses", json={"model": MODEL, "stream": True, **body},
                      timeout=30) as response:
        assert response.status_code == 200, response.read()
        lines = list(response.iter_lines())
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """Event types, runs of one delta type written once."""
    types = [event["type"] for event in events]
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1] or not t.endswith(".delta")]


def allowing(*servers: Running) -> tuple[str, ...]:
    """--mcp-allow for these servers: an SSE server's `/messages/` endpoint too (every URL reached is checked)."""
    prefixes = []
    for server in servers:
        prefixes.append(server.url)
        if server.url.endswith("/sse"):
            prefixes.append(server.url.removesuffix("/sse") + "/messages")
    return tuple(prefixes)


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
def test_the_sdk_gets_an_mcp_call_run_within_one_response(
        serve: Callable[..., LiveServer], vocab: Any, weather: Running, weather_sse: Running, tmp_path: Path,
        transport: str) -> None:
    mcp = weather if transport == "streamable-http" else weather_sse
    engine = Recording(scripted_engine(vocab, [FORECAST, ANSWER]))
    server = serve(engine=engine, mcp_allow=allowing(mcp))
    tool = mcp_tool(mcp, headers={"X-Api-Key": SECRET}, require_approval="never")
    body = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, "input": "Weather?", "tools": [tool]},
                      timeout=30).json()
    response = validate_response(body)
    assert [item.type for item in response.output] == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning",
                                                       "message"]
    listing, _, ran, _, _ = response.output
    assert listing.server_label == "weather" and listing.error is None
    assert [tool.name for tool in listing.tools] == ["get_forecast", "echo_authorization"]
    assert listing.tools[0].input_schema["required"] == ["city"]
    assert (ran.server_label, ran.name, ran.arguments) == ("weather", "get_forecast", '{"city":"Paris"}')
    assert (ran.status, ran.output, ran.error, ran.approval_request_id) == (
        "completed", "Paris: sunny, 21C", None, None)
    assert ran.id.startswith("mcp_") and listing.id.startswith("mcpl_")
    assert response.output_text == "It is sunny." and response.status == "completed"
    # The second prompt is the first, the model's tokens as generated, the result, and <|start|>assistant.
    first, second = (request.prompt_token_ids for request in engine.requests)
    generated = vocab.encode_harmony(FORECAST)
    assert second[: len(first) + len(generated)] == first + generated
    assert vocab.decode(second[len(first) + len(generated):]) == (
        "<|start|>weather.get_forecast to=assistant<|channel|>commentary<|message|>Paris: sunny, 21C<|end|>"
        "<|start|>assistant")
    declared = vocab.decode(first)
    # the server's instructions
    assert "## weather\n\n// Weather forecasts for cities.\nnamespace weather {" in declared
    assert "type get_forecast = (_: {\ncity: string,\ndays?: number | null,\n}) => any;" in declared
    assert "Calls to these tools must go to the commentary channel: 'functions'." in declared
    usage = response.usage
    assert usage.input_tokens == len(first) + len(second)  # each generation's prompt, summed
    assert usage.output_tokens == len(generated) + len(vocab.encode_harmony(ANSWER))
    assert usage.output_tokens_details.reasoning_tokens == (len(vocab.encode("Need a tool."))
                                                            + len(vocab.encode("Done.")))
    # The header reached the server; the response, the stored copy and the database show it redacted.
    assert SECRET in mcp.record.header_values("x-api-key")
    assert response.tools[0].headers == {"X-Api-Key": "[redacted]"}
    stored = httpx.get(f"{server.base_url}/v1/responses/{response.id}", timeout=10).text
    assert SECRET not in stored and SECRET not in json.dumps(body)
    assert SECRET.encode() not in b"".join(path.read_bytes() for path in tmp_path.glob("responses.sqlite3*"))


def test_streamed_mcp_events_are_the_sdks_in_order(serve: Callable[..., LiveServer], vocab: Any,
                                                   weather: Running) -> None:
    server = serve(completions=[FORECAST, ANSWER], mcp_allow=allowing(weather))
    body = {"input": "Weather?", "tools": [mcp_tool(weather, require_approval="never")]}
    events = stream(server, body)
    validate_events(events)
    item = ["response.output_item.added", "response.content_part.added"]
    done = ["response.content_part.done", "response.output_item.done"]
    reasoning = [*item, "response.reasoning_text.delta", "response.reasoning_text.done", *done]
    assert kinds(events) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
        "response.output_item.done",
        *reasoning,
        "response.output_item.added", "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done", "response.mcp_call.completed", "response.output_item.done",
        *reasoning,
        *item, "response.output_text.delta", "response.output_text.done", *done,
        "response.completed"]
    added = next(e["item"] for e in events
                 if e["type"] == "response.output_item.added" and e["item"]["type"] == "mcp_call")
    assert added["status"] == "in_progress" and added["arguments"] == "" and added["output"] is None
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.mcp_call_arguments.delta")
    assert deltas == '{"city":"Paris"}'
    # The SDK's stream helper accepts the events and builds the same response.
    with client_for(server).responses.stream(model=MODEL, **body) as helper:
        helper_types = [event.type for event in helper]
        final = helper.get_final_response()
    assert helper_types == [event["type"] for event in events]
    assert [item.type for item in final.output] == [item["type"] for item in events[-1]["response"]["output"]]
    assert final.output[2].output == "Paris: sunny, 21C" and final.output_text == "It is sunny."


@pytest.mark.parametrize("continuation", ["previous_response_id", "full input"])
def test_approval_round_trip(serve: Callable[..., LiveServer], vocab: Any, weather: Running, continuation: str) -> None:
    engine = Recording(scripted_engine(vocab, [FORECAST, ANSWER]))
    server = serve(engine=engine, mcp_allow=allowing(weather))
    client = client_for(server)
    tool = mcp_tool(weather)  # approval is required unless the request says otherwise, as with OpenAI
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[tool])
    assert [item.type for item in first.output] == ["mcp_list_tools", "reasoning", "mcp_approval_request"]
    request = first.output[2]
    assert request.id.startswith("mcpr_") and (request.server_label, request.name) == ("weather", "get_forecast")
    assert request.arguments == '{"city":"Paris"}' and first.status == "completed" and len(engine.requests) == 1
    validate_response(first.model_dump(mode="json", exclude_unset=True))
    approval = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    if continuation == "previous_response_id":
        body = {"previous_response_id": first.id, "input": [approval]}
    else:
        replayed = [item.model_dump(mode="json", exclude_unset=True) for item in first.output]
        body = {"input": [{"role": "user", "content": "Weather in Paris?"}, *replayed, approval], "store": False}
    events = stream(server, {**body, "tools": [tool]})
    validate_events(events)
    second = events[-1]["response"]
    assert [item["type"] for item in second["output"]] == ["mcp_call", "reasoning", "message"]  # listed already
    ran = second["output"][0]
    assert ran["approval_request_id"] == request.id and ran["output"] == "Paris: sunny, 21C"
    assert kinds(events)[2:8] == ["response.output_item.added", "response.mcp_call.in_progress",
                                  "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
                                  "response.mcp_call.completed", "response.output_item.done"]
    prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert "<|channel|>analysis<|message|>Need a tool.<|end|>" in prompt  # the tool loop goes on: reasoning kept
    assert prompt.endswith(
        '<|start|>assistant<|channel|>commentary to=weather.get_forecast <|constrain|>json<|message|>{"city":"Paris"}'
        "<|call|><|start|>weather.get_forecast to=assistant<|channel|>commentary<|message|>Paris: sunny, 21C<|end|>"
        "<|start|>assistant")


def test_a_declined_call_does_not_run_and_the_model_is_told(serve: Callable[..., LiveServer], vocab: Any,
                                                          weather: Running) -> None:
    engine = Recording(scripted_engine(vocab, [FORECAST, ANSWER]))
    client = client_for(serve(engine=engine, mcp_allow=allowing(weather)))
    tool = mcp_tool(weather, require_approval={"always": {"tool_names": ["get_forecast"]}})
    first = client.responses.create(model=MODEL, input="Weather?", tools=[tool])
    request = first.output[-1]
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[tool], input=[
        {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False, "reason": "not now"}])
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert ("<|start|>weather.get_forecast to=assistant<|channel|>commentary<|message|>The user declined this call; "
            "it did not run. Reason: not now<|end|><|start|>assistant"
            ) in vocab.decode(engine.requests[1].prompt_token_ids)
    bad = httpx.post(f"{client.base_url}responses", json={"model": MODEL, "tools": [tool], "input": [
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}]}, timeout=10)
    assert bad.status_code == 400 and "mcpr_nope" in bad.json()["error"]["message"]


def test_approval_filters() -> None:
    readonly = McpTool("look", "", {}, {"readOnlyHint": True})
    writes = McpTool("write", "", {})
    never_readonly = ApprovalPolicy.read({"never": {"read_only": True}})
    assert not never_readonly.required(readonly) and never_readonly.required(writes)
    assert ApprovalPolicy.read({"always": {"tool_names": ["write"]}, "never": {"tool_names": ["write", "look"]}}) \
        .required(writes)
    assert ApprovalPolicy.read(None).required(readonly) and not ApprovalPolicy.read("never").required(writes)
    assert ToolFilter.read({"tool_names": ["look"], "read_only": True}).matches(readonly)
    assert not ToolFilter.read(["look"]).matches(writes)


def test_a_failing_tool_gives_a_failed_call_and_the_model_is_told(serve: Callable[..., LiveServer], vocab: Any,
                                                                 trouble: Running) -> None:
    engine = Recording(scripted_engine(vocab, [call("trouble.fail"), ANSWER]))
    server = serve(engine=engine, mcp_allow=allowing(trouble))
    events = stream(server, {"input": "Go.", "tools": [mcp_tool(trouble, "trouble", require_approval="never")]})
    validate_events(events)
    assert "response.mcp_call.failed" in kinds(events) and "response.mcp_call.completed" not in kinds(events)
    response = events[-1]["response"]
    failed = response["output"][2]
    assert failed["status"] == "failed" and failed["output"] is None
    assert failed["error"]["type"] == "mcp_tool_execution_error"
    told = failed["error"]["content"][0]["text"]
    assert "Error executing tool fail" in told  # what the server says (it keeps the exception to itself)
    assert response["status"] == "completed" and response["output"][-1]["content"][0]["text"] == "It is sunny."
    prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert f"<|start|>trouble.fail to=assistant<|channel|>commentary<|message|>{told}<|end|>" in prompt


def test_a_tool_that_hangs_past_its_timeout_is_cancelled(serve: Callable[..., LiveServer], vocab: Any,
                                                         trouble: Running) -> None:
    trouble.record.events.clear()
    server = serve(completions=[call("trouble.hang"), ANSWER], mcp_allow=allowing(trouble), tool_call_timeout=0.5)
    response = client_for(server).responses.create(model=MODEL, input="Go.", tools=[
        mcp_tool(trouble, "trouble", require_approval="never")])
    hung = response.output[2]
    assert hung.status == "failed" and "timed out after 0.5 seconds" in hung.error.content[0]["text"]
    assert response.output_text == "It is sunny."
    assert trouble.record.wait_for("hang cancelled")


def test_a_client_that_leaves_mid_call_cancels_the_call_on_the_server(serve: Callable[..., LiveServer], vocab: Any,
                                                                      trouble: Running) -> None:
    trouble.record.events.clear()
    engine = Recording(scripted_engine(vocab, [call("trouble.hang"), ANSWER]))
    server = serve(engine=engine, mcp_allow=allowing(trouble))
    body = {"model": MODEL, "stream": True, "input": "Go.",
            "tools": [mcp_tool(trouble, "trouble", require_approval="never")]}
    with httpx.stream("POST", server.base_url + "/v1/responses", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if "response.mcp_call_arguments.done" in line:
                break
        assert trouble.record.wait_for("hang started")
    assert trouble.record.wait_for("hang cancelled")
    assert len(engine.requests) == 1  # the loop stopped: no second generation


def test_a_background_response_cancelled_mid_call(serve: Callable[..., LiveServer], vocab: Any,
                                                  trouble: Running) -> None:
    trouble.record.events.clear()
    client = client_for(serve(completions=[call("trouble.hang"), ANSWER], mcp_allow=allowing(trouble)))
    started = client.responses.create(model=MODEL, input="Go.", background=True, tools=[
        mcp_tool(trouble, "trouble", require_approval="never")])
    assert trouble.record.wait_for("hang started")
    # Its progress with the call in it is saved, as long as it takes while the response runs (the tool hangs).
    while True:
        current = client.responses.retrieve(started.id)
        if any(item.type == "mcp_call" for item in current.output):
            break
        assert current.status == "in_progress", current
        time.sleep(0.02)
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert trouble.record.wait_for("hang cancelled")
    stored = client.responses.retrieve(started.id)
    assert stored.status == "cancelled" and stored.output[-1].type == "mcp_call"
    assert stored.output[-1].status == "incomplete"
    validate_response(stored.model_dump(mode="json", exclude_unset=True))


def test_max_tool_calls_stops_further_calls_and_tells_the_model(serve: Callable[..., LiveServer], vocab: Any,
                                                                weather: Running) -> None:
    rome = call("weather.get_forecast", '{"city":"Rome"}', reasoning="And Rome.")
    engine = Recording(scripted_engine(vocab, [FORECAST, rome, ANSWER]))
    client = client_for(serve(engine=engine, mcp_allow=allowing(weather)))
    response = client.responses.create(model=MODEL, input="Paris and Rome?", max_tool_calls=1,
                                       tools=[mcp_tool(weather, require_approval="never")])
    assert [item.type for item in response.output] == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning",
                                                       "reasoning", "message"]
    assert response.output[2].arguments == '{"city":"Paris"}' and response.max_tool_calls == 1
    third = vocab.decode(engine.requests[2].prompt_token_ids)
    assert ("<|start|>weather.get_forecast to=assistant<|channel|>commentary<|message|>No more tool calls can run in "
            "this response") in third
    assert "Rome: sunny" not in third


def test_a_second_call_past_the_server_cap_ends_the_response(serve: Callable[..., LiveServer], vocab: Any,
                                                             weather: Running) -> None:
    engine = Recording(scripted_engine(vocab, [FORECAST]))  # it calls the tool every time
    client = client_for(serve(engine=engine, mcp_allow=allowing(weather), max_tool_calls=2))
    response = client.responses.create(model=MODEL, input="Loop.", tools=[mcp_tool(weather, require_approval="never")])
    assert [item.type for item in response.output].count("mcp_call") == 2
    assert len(engine.requests) == 4 and response.status == "completed"


def test_max_output_tokens_counts_over_the_whole_loop(serve: Callable[..., LiveServer], vocab: Any,
                                                      weather: Running) -> None:
    engine = Recording(scripted_engine(vocab, [FORECAST, ANSWER]))
    client = client_for(serve(engine=engine, mcp_allow=allowing(weather)))
    budget = len(vocab.encode_harmony(FORECAST)) + 3
    response = client.responses.create(model=MODEL, input="x", max_output_tokens=budget,
                                       tools=[mcp_tool(weather, require_approval="never")])
    assert [request.sampling.max_tokens for request in engine.requests] == [budget, 3]
    assert response.status == "incomplete" and response.usage.output_tokens == budget
    assert response.output[2].status == "completed"  # the call ran; the answer after it was cut


def test_a_result_the_context_cannot_hold_fails_the_response(serve: Callable[..., LiveServer], vocab: Any,
                                                            trouble: Running) -> None:
    engine = Recording(scripted_engine(vocab, [call("trouble.large", '{"chars": 20000}'), ANSWER]))
    client = client_for(serve(engine=engine, mcp_allow=allowing(trouble), max_model_len=2000))
    response = client.responses.create(model=MODEL, input="x", tools=[
        mcp_tool(trouble, "trouble", require_approval="never")])
    assert response.status == "failed" and response.error.code == "context_length_exceeded"
    assert response.output[2].type == "mcp_call" and len(response.output[2].output) == 20000
    assert len(engine.requests) == 1


@pytest.mark.parametrize("allow", [(), ("http://127.0.0.1:1/mcp",)])
def test_a_server_url_outside_mcp_allow_is_refused(serve: Callable[..., LiveServer], weather: Running,
                                                   allow: tuple[str, ...]) -> None:
    server = serve(completions=[ANSWER], mcp_allow=allow)
    before = len(weather.record.requests)
    reply = httpx.post(server.base_url + "/v1/responses", timeout=10, json={
        "model": MODEL, "input": "x", "tools": [mcp_tool(weather, headers={"Authorization": SECRET})]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "tools[0].server_url" and "--mcp-allow" in error["message"]
    assert SECRET not in reply.text and len(weather.record.requests) == before  # never contacted


def test_a_server_that_cannot_be_listed_is_a_424(serve: Callable[..., LiveServer]) -> None:
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{reserved.getsockname()[1]}/mcp"
        server = serve(completions=[ANSWER], mcp_allow=(url,))
        reply = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
            "model": MODEL, "input": "x", "tools": [{"type": "mcp", "server_label": "gone", "server_url": url}]})
    assert reply.status_code == 424 and reply.json()["error"]["code"] == "mcp_list_tools_failed"
    assert "'gone'" in reply.json()["error"]["message"]


@pytest.mark.parametrize(("tool", "param"), [
    ({"server_label": "functions", "server_url": "http://x/mcp"}, "tools[0].server_label"),
    ({"server_label": "w"}, "tools[0].server_url"),
    ({"server_label": "w", "connector_id": "connector_gmail"}, "tools[0].connector_id"),
    ({"server_label": "w", "server_url": "http://x/mcp", "headers": {"Host": "evil"}}, "tools[0].headers"),
    ({"server_label": "w", "server_url": "http://x/mcp", "authorization": "t", "headers": {"authorization": "u"}},
     "tools[0].authorization"),
    ({"server_label": "w", "server_url": "http://x/mcp", "require_approval": "sometimes"}, "tools[0].require_approval"),
])
def test_malformed_mcp_tools_are_400s(serve: Callable[..., LiveServer], tool: dict[str, Any], param: str) -> None:
    server = serve(completions=[ANSWER], mcp_allow=("http://x/mcp",))
    reply = httpx.post(server.base_url + "/v1/responses", timeout=10, json={
        "model": MODEL, "input": "x", "tools": [{"type": "mcp", **tool}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


@pytest.mark.parametrize(("fields", "param"), [
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_constraints_that_would_shut_server_tools_out_are_400s(serve: Callable[..., LiveServer], weather: Running,
                                                               fields: dict[str, Any], param: str) -> None:
    server = serve(completions=[ANSWER], mcp_allow=allowing(weather))
    reply = httpx.post(server.base_url + "/v1/responses", timeout=10, json={
        "model": MODEL, "input": "x", "tools": [mcp_tool(weather)], **fields})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


def test_tool_choice_none_offers_no_server_tool(serve: Callable[..., LiveServer], vocab: Any,
                                                weather: Running) -> None:
    engine = Recording(scripted_engine(vocab, [FORECAST]))
    client = client_for(serve(engine=engine, mcp_allow=allowing(weather)))
    response = client.responses.create(model=MODEL, input="x", tool_choice="none",
                                       tools=[mcp_tool(weather, require_approval="never")])
    assert [item.type for item in response.output] == ["mcp_list_tools", "reasoning"]  # the call was not run
    assert "namespace weather" not in vocab.decode(engine.requests[0].prompt_token_ids)
    assert len(engine.requests) == 1


def test_authorization_reaches_the_server_and_never_the_model_or_the_logs(
        serve: Callable[..., LiveServer], vocab: Any, weather: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy")
    engine = Recording(scripted_engine(vocab, [call("weather.echo_authorization"), ANSWER]))
    server = serve(engine=engine, mcp_allow=allowing(weather), log_requests=True)
    response = client_for(server).responses.create(model=MODEL, input="Who am I?", tools=[
        mcp_tool(weather, authorization=TOKEN, headers={"X-Trace": SECRET}, require_approval="never")])
    assert f"Bearer {TOKEN}" in weather.record.header_values("authorization")
    assert response.output[2].output == "Authorization: [redacted]"  # the server echoed it: scrubbed
    assert TOKEN not in vocab.decode(engine.requests[1].prompt_token_ids)
    assert response.tools[0].authorization == "[redacted]"
    logged = "\n".join(record.getMessage() + str(getattr(record, "detail", "")) for record in caplog.records)
    assert "X-Trace" in logged and "[redacted]" in logged  # the request body was logged, cleaned
    assert TOKEN not in logged and SECRET not in logged


def test_request_bodies_are_logged_without_mcp_secrets() -> None:
    body = json.dumps({"model": "m", "tools": [{"type": "mcp", "headers": {"A": SECRET}, "authorization": TOKEN},
                                               {"type": "function", "name": "f"}]}).encode()
    cleaned = redact_body(body)
    assert SECRET.encode() not in cleaned and TOKEN.encode() not in cleaned and b'"A": "[redacted]"' in cleaned
    escaped = b'{"tools": [{"type": "mcp", "h\\u0065aders": {"A": "' + SECRET.encode() + b'"}}]}'
    assert SECRET.encode() not in redact_body(escaped)
    broken = b'{"tools": [{"headers": {"A": "' + SECRET.encode() + b'"}}'
    assert SECRET.encode() not in redact_body(broken)
    plain = b'{"model": "m", "input": "hi"}'
    assert redact_body(plain) is plain


def test_openai_agents_hosted_mcp_tool(serve: Callable[..., LiveServer], vocab: Any, weather: Running) -> None:
    engine = Recording(scripted_engine(vocab, [FORECAST, ANSWER]))
    server = serve(engine=engine, mcp_allow=allowing(weather))
    approvals: list[str] = []

    def approve(request: Any) -> dict[str, Any]:
        approvals.append(request.data.name)
        return {"approve": True}

    async def run(policy: str, callback: Any) -> Any:
        client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        config: Any = {"type": "mcp", "server_label": "weather", "server_url": weather.url, "require_approval": policy}
        agent = Agent(name="weather", instructions="Use the weather tools.",
                      model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                      tools=[HostedMCPTool(tool_config=config, on_approval_request=callback)])
        async with client:
            return await Runner.run(agent, "Weather in Paris?")

    for policy, callback in (("never", None), ("always", approve)):
        result = asyncio.run(run(policy, callback))
        assert result.final_output == "It is sunny."
        raw = [item.raw_item for item in result.new_items]
        ran = [item for item in raw if getattr(item, "type", None) == "mcp_call"]
        assert len(ran) == 1 and ran[0].output == "Paris: sunny, 21C"
    assert approvals == ["get_forecast"]
    assert len(engine.requests) == 4
    last = vocab.decode(engine.requests[-1].prompt_token_ids)
    assert "Use the weather tools." in last and "<|message|>Paris: sunny, 21C<|end|>" in last
