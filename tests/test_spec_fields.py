"""Every request field the installed openai SDK documents is accepted, or refused with a reason: never
"Unrecognized request argument".

The SDK's request types are walked (the TypedDicts of `chat.completions.create`, `responses.create` and the beta
`beta.responses.create`, their messages, input items, tools and options): each field is sent with a plausible
value, and as null wherever the type allows null. A field the SDK adds later fails
`test_every_sdk_field_is_classified` until someone decides whether it is accepted or refused here (and says so in
the docs).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from openai.types.beta import BetaResponseConfigurationUpdateItemParamParam, BetaToolParam, BetaToolSearchToolParam
from openai.types.beta import response_create_params as beta_params
from openai.types.beta.beta_response_input_item_param import BetaResponseInputItemParam
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionContentPartParam,
    ChatCompletionContentPartTextParam,
    ChatCompletionDeveloperMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionStreamOptionsParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionToolUnionParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import (
    CustomToolParam,
    EasyInputMessageParam,
    FunctionToolParam,
    ResponseConfigurationUpdateItemParamParam,
    ResponseCustomToolCallOutputParam,
    ResponseCustomToolCallParam,
    ResponseFunctionToolCallParam,
    ResponseInputContentParam,
    ResponseInputItemParam,
    ResponseInputTextParam,
    ResponseOutputMessageParam,
    ResponseOutputTextParam,
    ResponseReasoningItemParam,
    ResponseTextConfigParam,
    ToolChoiceCustomParam,
    ToolParam,
    ToolSearchToolParam,
    namespace_tool_param,
    response_input_item_param,
)
from openai.types.responses import response_create_params as responses_params
from openai.types.responses.namespace_tool_param import NamespaceToolParam
from openai.types.responses.response_input_item_param import FunctionCallOutput
from openai.types.shared_params import FunctionDefinition, Reasoning, custom_tool_input_format
from openai.types.shared_params.response_format_json_schema import JSONSchema

from parsers.vocab import Vocab
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.scripted import scripted_engine
from proxy.state import ServerState
from proxy.store.sqlite import SQLiteResponseStore
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER, WEATHER

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
THANKS = {"role": "user", "content": "Thanks."}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": None}
FUNCTION_CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
FUNCTION_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
OUTPUT_TEXT = {"type": "output_text", "text": "Hello.", "annotations": []}
OUTPUT_MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                  "content": [OUTPUT_TEXT]}
PREVIOUS = "<the id of a stored response>"  # replaced when sent
CONVERSATION = "<the id of a new conversation>"  # replaced when sent
NAMESPACE = {"type": "namespace", "name": "crm", "description": "The CRM.", "tools": []}
ADDITIONAL = {"type": "additional_tools", "role": "developer", "tools": [TOOL]}
CUSTOM = {"type": "custom", "name": "apply_patch"}
CUSTOM_CALL = {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"}
CUSTOM_OUTPUT = {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"}
UPDATE = {"type": "configuration_update", "reasoning": {"effort": "high"}}

# A plausible value of every field of `responses.create` (the beta's adds `multi_agent`).
RESPONSES_CREATE = {
    "input": [QUESTION], "model": MODEL, "access_programs": {"cyber": "standard"}, "background": True,
    "background_options": {"completion_window": "soonest"},
    "context_management": [{"type": "compaction", "compact_threshold": 100000}], "conversation": CONVERSATION,
    "image": {"context_compression": "auto"}, "include": ["reasoning.encrypted_content"],
    "instructions": "Be brief.", "max_output_tokens": 64, "max_tool_calls": 1, "metadata": {"team": "a"},
    "moderation": {"model": "omni-moderation-latest"}, "parallel_tool_calls": False,
    "previous_response_id": PREVIOUS, "prompt": {"id": "pmpt_123"}, "prompt_cache_key": "weather",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"}, "prompt_cache_retention": "in_memory",
    "reasoning": {"effort": "low"}, "safety_identifier": "user-1", "service_tier": "priority", "store": False,
    "stream": True, "stream_options": {"include_obfuscation": False}, "temperature": 0.7,
    "text": {"verbosity": "medium"}, "tool_choice": "auto", "tools": [TOOL], "top_logprobs": 0, "top_p": 0.9,
 "truncation": "disabled", "user": "user-1",
}


@dataclass(frozen=True)
class Surface:
    """One of the SDK's request types, and where an object of it goes in a request."""

    name: str
    sdk_type: type  # the SDK's TypedDict
    path: str
    base: dict[str, Any]  # an object with the required fields
    place: Callable[[dict[str, Any]], dict[str, Any]]  # the object -> the request body, model aside
    values: dict[str, Any]  # a plausible value of every field
    refused: dict[str, str] = field(default_factory=dict)  # field -> why it is a 400 with a value (README)
    null_refused: dict[str, str] = field(default_factory=dict)  # nullable in the SDK, but not null here: why


def chat(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {"messages": messages, **extra}


SURFACES = [
    Surface(
        "chat.completions.create", chat_params.CompletionCreateParamsNonStreaming, CHAT, chat([QUESTION]),
        lambda body: body,
        {"messages": [QUESTION], "model": MODEL, "audio": {"voice": "alloy", "format": "wav"}, "frequency_penalty": 0,
         "function_call": "auto", "functions": [{"name": "get_weather", "parameters": SCHEMA}], "logit_bias": {},
         "logprobs": False, "max_completion_tokens": 64, "max_tokens": 64, "metadata": {"team": "a"},
         "modalities": ["text"], "moderation": {"model": "omni-moderation-latest"}, "n": 1,
         "parallel_tool_calls": False, "prediction": {"type": "content", "content": "It is 18C."},
         "presence_penalty": 0, "prompt_cache_key": "weather",
         "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
         "prompt_cache_retention": "24h", "reasoning_effort": "low", "response_format": {"type": "json_object"},
         "safety_identifier": "user-1", "seed": 7, "service_tier": "flex", "stop": ["\n\n\n"], "store": False,
         "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.7, "tool_choice": "auto",
         "tools": [WEATHER], "top_logprobs": 0, "top_p": 0.9, "user": "user-1", "verbosity": "medium",
         "web_search_options": {"search_context_size": "low"}},
        refused={"audio": "gpt-oss produces text only",
                 "function_call": "deprecated: use tool_choice",
                 "functions": "deprecated: use tools",
                 "moderation": "no moderation model runs here",
                 "web_search_options": "no built-in web search; declare a function tool"},
    ),
    Surface(
        "assistant message", ChatCompletionAssistantMessageParam, CHAT, {"role": "assistant", "content": "Sunny."},
        lambda message: chat([QUESTION, message, THANKS]),
        {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}], "name": "helper",
         "refusal": "I cannot help with that.", "tool_calls": [CALL], "audio": {"id": "audio_abc123"},
         "function_call": {"name": "get_weather", "arguments": "{}"}},
        refused={"audio": "gpt-oss produces text only: an earlier audio answer cannot be referenced",
                 "function_call": "deprecated: send the call in tool_calls"},
    ),
    Surface(
        "tool message", ChatCompletionToolMessageParam, CHAT, RESULT, lambda message: chat([QUESTION, CALLED, message]),
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
    ),
    Surface(
        "user message", ChatCompletionUserMessageParam, CHAT, QUESTION, lambda message: chat([message]),
        {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "alice"},
    ),
    Surface(
        "system message", ChatCompletionSystemMessageParam, CHAT, {"role": "system", "content": "Be brief."},
        lambda message: chat([message, QUESTION]),
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}], "name": "rules"},
    ),
    Surface(
        "developer message", ChatCompletionDeveloperMessageParam, CHAT, {"role": "developer", "content": "Be brief."},
        lambda message: chat([message, QUESTION]),
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}], "name": "rules"},
    ),
    Surface(
        "text part", ChatCompletionContentPartTextParam, CHAT, {"type": "text", "text": "Hi"},
        lambda part: chat([{"role": "user", "content": [part]}]),
        {"type": "text", "text": "Hi", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}},
    ),
    Surface(
        "assistant tool call", ChatCompletionMessageFunctionToolCallParam, CHAT, CALL,
        lambda call: chat([QUESTION, {**CALLED, "tool_calls": [call]}, RESULT]),
        {"id": "call_1", "type": "function", "function": CALL["function"]},
    ),
    Surface(
        "chat tool", ChatCompletionFunctionToolParam, CHAT, WEATHER, lambda tool: chat([QUESTION], tools=[tool]),
        {"type": "function", "function": WEATHER["function"]},
    ),
    Surface(
        "function definition", FunctionDefinition, CHAT, {"name": "get_weather"},
        lambda function: chat([QUESTION], tools=[{"type": "function", "function": function}]),
        {"name": "get_weather", "description": "Weather now.", "parameters": SCHEMA, "strict": True},
    ),
    Surface(
        "chat stream_options", ChatCompletionStreamOptionsParam, CHAT, {},
        lambda options: chat([QUESTION], stream=True, stream_options=options),
        {"include_usage": True, "include_obfuscation": False},
    ),
    Surface(
        "response_format json_schema", JSONSchema, CHAT, {"name": "weather", "schema": SCHEMA},
        lambda schema: chat([QUESTION], response_format={"type": "json_schema", "json_schema": schema}),
        {"name": "weather", "description": "The weather.", "schema": SCHEMA, "strict": True},
    ),
    Surface(
        "chat prompt_cache_options", chat_params.PromptCacheOptions, CHAT, {},
        lambda options: chat([QUESTION], prompt_cache_options=options), {"mode": "explicit", "ttl": "30m"},
    ),
    Surface(
        "responses.create", responses_params.ResponseCreateParamsNonStreaming, RESPONSES, {"input": "Hi"},
        lambda body: body,
        RESPONSES_CREATE,
        refused={"moderation": "no moderation model runs here", "prompt": "no stored prompt templates"},
    ),
    Surface(
        "reasoning", Reasoning, RESPONSES, {}, lambda reasoning: {"input": "Hi", "reasoning": reasoning},
        {"context": "current_turn", "effort": "high", "generate_summary": "auto", "mode": "standard",
         "summary": "detailed"},
    ),
    Surface(
        "text", ResponseTextConfigParam, RESPONSES, {}, lambda text: {"input": "Hi", "text": text},
        {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}, "verbosity": "medium"},
    ),
    Surface(
        "function tool", FunctionToolParam, RESPONSES, TOOL, lambda tool: {"input": "Hi", "tools": [tool]},
        {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True,
         "description": "Weather now.", "allowed_callers": ["direct"], "async": False, "defer_loading": True,
         "output_schema": {"type": "object", "properties": {"degrees": {"type": "number"}}}},
    ),
    Surface(
        "namespace tool", NamespaceToolParam, RESPONSES, NAMESPACE, lambda tool: {"input": "Hi", "tools": [tool]},
        {**NAMESPACE, "tools": [TOOL]},
    ),
    Surface(
        "namespace member function", namespace_tool_param.ToolFunction, RESPONSES, TOOL,
        lambda tool: {"input": "Hi", "tools": [{**NAMESPACE, "tools": [tool]}]},
        {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True,
         "description": "Weather now.", "allowed_callers": ["direct"], "async": False, "defer_loading": True,
         "output_schema": {"type": "object", "properties": {"degrees": {"type": "number"}}}},
    ),
    Surface(
        "custom tool", CustomToolParam, RESPONSES, CUSTOM, lambda tool: {"input": "Hi", "tools": [tool]},
        {**CUSTOM, "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
         "allowed_callers": ["direct"], "async": False, "defer_loading": True},
    ),
    Surface(
        "custom tool grammar", custom_tool_input_format.Grammar, RESPONSES,
        {"type": "grammar", "syntax": "lark", "definition": 'start: "x"'},
        lambda grammar: {"input": "Hi", "tools": [{**CUSTOM, "format": grammar}]},
        {"type": "grammar", "syntax": "lark", "definition": 'start: "x"+'},
    ),
    Surface(
        "custom tool call item", ResponseCustomToolCallParam, RESPONSES, CUSTOM_CALL,
        lambda call: {"input": [QUESTION, call, CUSTOM_OUTPUT]},
        {**CUSTOM_CALL, "id": "ctc_1", "caller": {"type": "direct"}, "namespace": "crm", "async": False},
    ),
    Surface(
        "custom tool call output item", ResponseCustomToolCallOutputParam, RESPONSES, CUSTOM_OUTPUT,
        lambda output: {"input": [QUESTION, CUSTOM_CALL, output]},
        {**CUSTOM_OUTPUT, "output": [{"type": "input_text", "text": "done"}], "id": "ctco_1",
         "caller": {"type": "direct"}},
    ),
    Surface(
        "tool_choice custom", ToolChoiceCustomParam, RESPONSES, {"type": "custom", "name": "apply_patch"},
        lambda choice: {"input": "Hi", "tools": [CUSTOM], "tool_choice": choice},
        {"type": "custom", "name": "apply_patch"},
    ),
    Surface(
        "additional_tools item", response_input_item_param.AdditionalTools, RESPONSES, ADDITIONAL,
        lambda item: {"input": [QUESTION, item]}, {**ADDITIONAL, "id": "at_1"},
    ),
    Surface(
        "input message", EasyInputMessageParam, RESPONSES, QUESTION, lambda message: {"input": [message]},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}], "phase": "final_answer",
         "type": "message"},
    ),
    Surface(
        "input text part", ResponseInputTextParam, RESPONSES, {"type": "input_text", "text": "Hi"},
        lambda part: {"input": [{"role": "user", "content": [part]}]},
        {"type": "input_text", "text": "Hi", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}},
    ),
    Surface(
        "output message item", ResponseOutputMessageParam, RESPONSES, OUTPUT_MESSAGE,
        lambda message: {"input": [QUESTION, message, THANKS]},
        {**OUTPUT_MESSAGE, "phase": "final_answer"},
    ),
    Surface(
        "output text part", ResponseOutputTextParam, RESPONSES, OUTPUT_TEXT,
        lambda part: {"input": [QUESTION, {**OUTPUT_MESSAGE, "content": [part]}, THANKS]},
        {**OUTPUT_TEXT, "logprobs": [{"token": "Hello", "bytes": [72], "logprob": -0.1, "top_logprobs": []}],
         "annotations": [{"type": "url_citation", "url": "https://example.com", "title": "Example", "start_index": 0,
                          "end_index": 5}]},
    ),
    Surface(
        "function call item", ResponseFunctionToolCallParam, RESPONSES, FUNCTION_CALL,
        lambda call: {"input": [QUESTION, call, FUNCTION_OUTPUT]},
        {**FUNCTION_CALL, "id": "fc_1", "caller": {"type": "direct"}, "status": "completed", "async": False,
         "namespace": "crm"},
    ),
    Surface(
        "function call output item", FunctionCallOutput, RESPONSES, FUNCTION_OUTPUT,
        lambda output: {"input": [QUESTION, FUNCTION_CALL, output]},
        {**FUNCTION_OUTPUT, "output": [{"type": "input_text", "text": "sunny"}], "id": "fco_1",
         "caller": {"type": "direct"}, "name": "get_weather", "status": "completed", "namespace": "crm"},
        null_refused={"call_id": "an output must name the call it answers"},
    ),
    Surface(
        "reasoning item", ResponseReasoningItemParam, RESPONSES, {"type": "reasoning", "id": "rs_1", "summary": []},
        lambda item: {"input": [QUESTION, item, FUNCTION_CALL, FUNCTION_OUTPUT]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need the weather."}],
         "content": [{"type": "reasoning_text", "text": "Need the weather."}], "encrypted_content": None,
         "status": "completed"},
    ),
    Surface(
        "responses stream_options", responses_params.StreamOptions, RESPONSES, {},
        lambda options: {"input": "Hi", "stream": True, "stream_options": options}, {"include_obfuscation": True},
    ),
    Surface(
        "responses prompt_cache_options", responses_params.PromptCacheOptions, RESPONSES, {},
        lambda options: {"input": "Hi", "prompt_cache_options": options},
        {"comparison_response_id": "resp_123", "mode": "explicit", "ttl": "12h", "prewarm": True},
    ),
    Surface(
        "background_options", responses_params.BackgroundOptions, RESPONSES, {},
        lambda options: {"input": "Hi", "background": True, "background_options": options},
        {"completion_window": "2h", "continuation_id": "batch-7"},
    ),
    # The beta API (`client.beta.responses`): the same request, and what it adds.
    Surface(
        "beta.responses.create", beta_params.ResponseCreateParamsNonStreaming, RESPONSES, {"input": "Hi"},
        lambda body: body,
        {**RESPONSES_CREATE, "multi_agent": {"enabled": False}},
        refused={"moderation": "no moderation model runs here", "prompt": "no stored prompt templates"},
    ),
    Surface(
        "beta reasoning", beta_params.Reasoning, RESPONSES, {},
        lambda reasoning: {"input": "Hi", "reasoning": reasoning},
        {"context": "all_turns", "effort": "max", "generate_summary": "auto", "mode": "standard", "summary": "auto"},
    ),
    Surface(
        "beta multi_agent", beta_params.MultiAgent, RESPONSES, {"enabled": False},
        lambda options: {"input": "Hi", "multi_agent": options}, {"enabled": False, "max_concurrent_subagents": 3},
    ),
    Surface(
        "tool_search tool", ToolSearchToolParam, RESPONSES, {"type": "tool_search"},
        lambda tool: {"input": "Hi", "tools": [TOOL, tool]},
        {"type": "tool_search", "description": "Find tools.", "execution": "client",
         "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
    ),
    Surface(
        "beta tool_search tool", BetaToolSearchToolParam, RESPONSES, {"type": "tool_search"},
        lambda tool: {"input": "Hi", "tools": [TOOL, tool]},
        {"type": "tool_search", "description": "Find tools.", "execution": "server", "parameters": None},
    ),
    Surface(
        "configuration_update item", ResponseConfigurationUpdateItemParamParam, RESPONSES, UPDATE,
        lambda item: {"input": [QUESTION, item]},
        {**UPDATE, "id": "cfg_1", "text": {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA}}},
    ),
    Surface(
        "beta configuration_update item", BetaResponseConfigurationUpdateItemParamParam, RESPONSES, UPDATE,
        lambda item: {"input": [QUESTION, item]},
        {**UPDATE, "id": "cfg_1", "agent": {"agent_name": "root"}, "text": {"format": {"type": "text"}}},
    ),
]
BY_NAME = {surface.name: surface for surface in SURFACES}


def fields(sdk_type: type) -> set[str]:
    """The body fields of a request type: those the SDK sends as a header (`betas`: `OpenAI-Beta`) left out."""
    every = set(sdk_type.__required_keys__) | set(sdk_type.__optional_keys__)  # type: ignore[attr-defined]
    hints = typing.get_type_hints(sdk_type, include_extras=True)
    return {name for name in every if not any(str(getattr(extra, "alias", "")).startswith("openai-")
                                              for extra in getattr(hints[name], "__metadata__", ()))}


def nullable(sdk_type: type) -> set[str]:
    hints = typing.get_type_hints(sdk_type)
    return {name for name, hint in hints.items() if type(None) in typing.get_args(hint) and name in fields(sdk_type)}


@pytest.fixture(scope="module")
def server(vocab: Vocab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store = SQLiteResponseStore(tmp_path_factory.mktemp("store") / "responses.sqlite3")
    engine = scripted_engine(vocab, [ANSWER])
    live = LiveServer(create_app(ServerState(ServerConfig(), vocab, engine, store)), engine).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def previous(server: LiveServer) -> str:
    response = httpx.post(server.base_url + RESPONSES, json={"model": MODEL, "input": "Hi"}, timeout=30)
    return response.json()["id"]


def send(server: LiveServer, surface: Surface, name: str, value: Any, previous: str) -> httpx.Response:
    if value == CONVERSATION:
        value = httpx.post(server.base_url + "/v1/conversations", json={}, timeout=30).json()["id"]
    body = surface.place({**surface.base, name: previous if value == PREVIOUS else value})
    return httpx.post(server.base_url + surface.path, json={"model": MODEL, **body}, timeout=30)


@pytest.mark.parametrize("surface", SURFACES, ids=lambda surface: surface.name)
def test_every_sdk_field_is_classified(surface: Surface) -> None:
    assert set(surface.values) == fields(surface.sdk_type), "a field the installed SDK documents is not classified"
    assert set(surface.refused) <= set(surface.values)


@pytest.mark.parametrize(("surface_name", "name"),
                         [(surface.name, name) for surface in SURFACES for name in sorted(surface.values)])
def test_each_field_is_accepted_or_refused_with_a_reason(
    server: LiveServer, previous: str, surface_name: str, name: str
) -> None:
    surface = BY_NAME[surface_name]
    response = send(server, surface, name, surface.values[name], previous)
    if name not in surface.refused:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and name in error["param"]
    assert "Unrecognized" not in error["message"] and "not supported" in error["message"]


@pytest.mark.parametrize(("surface_name", "name"),
                         [(surface.name, name) for surface in SURFACES for name in sorted(nullable(surface.sdk_type))])
def test_null_is_accepted_where_the_sdk_allows_it(
    server: LiveServer, previous: str, surface_name: str, name: str
) -> None:
    surface = BY_NAME[surface_name]
    response = send(server, surface, name, None, previous)
    if name in surface.null_refused:
        assert response.status_code == 400 and response.json()["error"]["param"].endswith(name)
    else:
        assert response.status_code == 200, response.text


# Values of accepted fields that would change the answer in a way this server cannot: a 400 that says why.
REFUSED_VALUES = [
    (CHAT, chat([QUESTION], tools=[WEATHER], tool_choice={"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}}]}}), "tool_choice.type"),
    (CHAT, chat([QUESTION], tool_choice={"type": "custom", "custom": {"name": "grammar"}}), "tool_choice.type"),
    (RESPONSES, {"input": "Hi", "reasoning": {"mode": "pro"}}, "reasoning.mode"),
    (RESPONSES, {"input": "Hi", "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]},
     "include[1]"),
    (RESPONSES, {"input": "Hi", "tools": [{**TOOL, "allowed_callers": ["programmatic"]}]}, "tools[0].allowed_callers"),
    (RESPONSES, {"input": "Hi", "tools": [{**TOOL, "async": True}]}, "tools[0].async"),
    (RESPONSES, {"input": "Hi", "multi_agent": {"enabled": True}}, "multi_agent"),
    (RESPONSES, {"input": "Hi", "tools": [TOOL],
                 "tool_choice": {"type": "allowed_tools", "mode": "required",
                                 "tools": [{"type": "function", "name": "get_weather"}]}},
     "tool_choice.type"),
    (RESPONSES, {"input": "Hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED_VALUES)
def test_values_that_would_change_the_answer_are_refused(
    server: LiveServer, path: str, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(server.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_parameter", error
    assert "not supported" in error["message"] or "not offered" in error["message"]


# -- every kind of tool, input item and content part the SDK knows ----------------------------------------------------
# The unions of the SDK's request types, walked: each member's `type` (or `role`) is served here (its fields are
# checked by the surfaces above), or refused with a 400 that names it and says why. A kind the SDK adds later fails
# `test_every_sdk_kind_is_classified` until it is decided (and documented in the README).


def union_kinds(union: Any) -> set[str]:
    """The discriminators (`type`, else `role`) of a union's TypedDict members; Literal members are left out."""
    kinds: set[str] = set()
    for member in typing.get_args(union) or (union,):
        if typing.get_origin(member) is typing.Union:
            kinds |= union_kinds(member)
            continue
        if not hasattr(member, "__required_keys__"):
            continue
        hints = typing.get_type_hints(member)
        hint = hints.get("type", hints.get("role"))
        while typing.get_origin(hint) is typing.Union:  # Optional[Literal[...]]
            hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        kinds |= set(typing.get_args(hint))
    return kinds


@dataclass(frozen=True)
class Kinds:
    """One union of the SDK: the kinds served here, and how to send one kind alone."""

    name: str
    union: Any
    path: str
    served: frozenset[str]
    send: Callable[[str], dict[str, Any]]  # kind -> the request body, model aside
    param: str  # where the refusal points


KINDS_SERVED_TOOLS = frozenset({"function", "custom", "namespace", "tool_search", "mcp", "web_search",
                                "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
                                "code_interpreter"})
KINDS_SERVED_ITEMS = frozenset({"message", "reasoning", "function_call", "function_call_output", "item_reference",
                     "additional_tools", "custom_tool_call", "custom_tool_call_output",
                     "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response", "web_search_call",
                     "code_interpreter_call", "compaction", "compaction_trigger", "configuration_update"})
KINDS = [
    Kinds("responses tools", ToolParam, RESPONSES, KINDS_SERVED_TOOLS,
          lambda kind: {"input": "Hi", "tools": [{"type": kind}]}, "tools[0].type"),
    Kinds("responses input items", ResponseInputItemParam, RESPONSES, KINDS_SERVED_ITEMS,
          lambda kind: {"input": [QUESTION, {"type": kind}]}, "input[1].type"),
    Kinds("beta responses tools", BetaToolParam, RESPONSES, KINDS_SERVED_TOOLS,
          lambda kind: {"input": "Hi", "tools": [{"type": kind}]}, "tools[0].type"),
    Kinds("beta responses input items", BetaResponseInputItemParam, RESPONSES,
          KINDS_SERVED_ITEMS | {"agent_message"},  # agent_message: Codex's sub-agents, issue 27's branch `codex`
          lambda kind: {"input": [QUESTION, {"type": kind}]}, "input[1].type"),
    Kinds("responses content parts", ResponseInputContentParam, RESPONSES, frozenset({"input_text", "input_image"}),
          lambda kind: {"input": [{"role": "user", "content": [{"type": kind}]}]}, "input[0].content[0]"),
    Kinds("responses tool_choice", responses_params.ToolChoice, RESPONSES, frozenset({"function", "custom"}),
          lambda kind: {"input": "Hi", "tools": [TOOL], "tool_choice": {"type": kind}}, "tool_choice.type"),
    Kinds("chat tools", ChatCompletionToolUnionParam, CHAT, frozenset({"function"}),
          lambda kind: chat([QUESTION], tools=[{"type": kind}]), "tools[0].type"),
    Kinds("chat content parts", ChatCompletionContentPartParam, CHAT, frozenset({"text"}),
          lambda kind: chat([{"role": "user", "content": [{"type": kind}]}]), "messages[0].content[0]"),
    Kinds("chat messages", ChatCompletionMessageParam, CHAT,
          frozenset({"developer", "system", "user", "assistant", "tool"}),
          lambda kind: chat([QUESTION, {"role": kind, "name": "f", "content": "x"}]), "messages[1].role"),
    Kinds("chat tool_choice", chat_params.ChatCompletionToolChoiceOptionParam, CHAT, frozenset({"function"}),
          lambda kind: chat([QUESTION], tools=[WEATHER], tool_choice={"type": kind}), "tool_choice.type"),
]
KINDS_BY_NAME = {kinds.name: kinds for kinds in KINDS}


@pytest.mark.parametrize("kinds", KINDS, ids=lambda kinds: kinds.name)
def test_every_sdk_kind_is_classified(kinds: Kinds) -> None:
    known = union_kinds(kinds.union)
    assert kinds.served <= known, "a kind served here is no longer in the SDK"
    assert known, "the SDK's union could not be read"


@pytest.mark.parametrize(("union", "kind"), [(kinds.name, kind) for kinds in KINDS
                                             for kind in sorted(union_kinds(kinds.union) - kinds.served)])
def test_each_kind_not_served_is_refused_with_a_reason(server: LiveServer, union: str, kind: str) -> None:
    kinds = KINDS_BY_NAME[union]
    response = httpx.post(server.base_url + kinds.path, json={"model": MODEL, **kinds.send(kind)}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == kinds.param, error
    message = error["message"]
    assert repr(kind) in message and "not supported" in message and "Unrecognized" not in message, message
    assert message.split("not supported", 1)[1].strip(" .:"), f"no reason given: {message}"


# Fields clients send that the SDK does not declare (yet): accepted, documented in the README.
BEYOND_THE_SDK = [
    (RESPONSES, {"input": "Hi", "client_metadata": {"session_id": "0199", "turn_id": "7", "x-codex-turn-metadata":
                                                    '{"sandbox":"seatbelt"}'}}),  # Codex, every request
]


@pytest.mark.parametrize(("path", "body"), BEYOND_THE_SDK)
def test_fields_beyond_the_sdk_that_clients_send_are_accepted(
    server: LiveServer, path: str, body: dict[str, Any],
) -> None:
    response = httpx.post(server.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == 200, response.text
