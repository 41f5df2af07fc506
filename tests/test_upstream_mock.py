"""A harmony-proxy on the mock engine used as the upstream of another calls tools as it does in front of clients.

Raw /v1/completions carries no tools (only the prompt's token ids), so the mock behind reads them from the prompt's
declarations (proxy/engines/declared_tools.py). Each loop runs twice, straight to a mock and through a front server
with `--engine upstream`, and must go the same way: the same call with the same arguments, then the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from proxy.engines.upstream.engine import UpstreamEngine
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import WEATHER, client_for

NESTED = {"type": "function", "function": {"name": "book_trip", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
                   "dates": {"type": "object", "properties": {"start": {"type": "string"}}, "required": ["start"]},
                   "guests": {"type": "array", "items": {"type": "integer"}}},
    "required": ["city", "dates", "unit"],
}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def pair(serve: Callable[..., LiveServer], vocab: Any) -> tuple[LiveServer, LiveServer]:
    """(a mock server, a front server whose upstream is another mock server)."""
    back = serve()
    return serve(), serve(engine=UpstreamEngine(vocab, [back.base_url + "/v1"], MODEL))


def chat_loop(server: LiveServer, tool: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """Ask for the tool by name, answer its call, and return (the call's name, its arguments, the final answer)."""
    client = client_for(server)
    name = tool["function"]["name"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Please call {name} for Paris."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CLOCK, tool]).choices[0]
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    messages += [first.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[CLOCK, tool]).choices[0]
    assert second.finish_reason == "stop"
    return call.function.name, json.loads(call.function.arguments), second.message.content


@pytest.mark.parametrize("tool", [WEATHER, NESTED], ids=["flat", "nested"])
def test_a_chat_tool_loop_through_an_upstream_mock_goes_as_in_front(pair: tuple[LiveServer, LiveServer],
                                                                     tool: dict[str, Any]) -> None:
    direct, through = (chat_loop(server, tool) for server in pair)
    assert through == direct
    name, arguments, answer = through
    assert name == tool["function"]["name"]
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert f"The tool {name} returned: 18C and sunny" in answer


def test_a_responses_namespace_call_through_an_upstream_mock_goes_as_in_front(
        pair: tuple[LiveServer, LiveServer]) -> None:
    tools = [{"type": "namespace", "name": "weather", "description": "Weather tools.", "tools": [
        {"type": "function", "name": "forecast", "parameters": WEATHER["function"]["parameters"]}]}]
    outputs = []
    for server in pair:
        client = client_for(server)
        first = client.responses.create(model=MODEL, input="Please call forecast for Paris.", tools=tools)
        call = next(item for item in first.output if item.type == "function_call")
        second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=tools, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}])
        outputs.append((call.namespace, call.name, call.arguments, second.output_text))
    assert outputs[0] == outputs[1]
    assert outputs[1][:2] == ("weather", "forecast") and "returned: rain" in outputs[1][3]
