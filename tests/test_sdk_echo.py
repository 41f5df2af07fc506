"""What SDKs send back: replies appended to the history as the SDKs' own idioms write them, end to end.

`messages.append(reply.choices[0].message.model_dump())` writes every field of openai-python's message type
(`annotations`, `audio`, `function_call`, `refusal`, and from the parse and stream helpers `parsed`,
`tool_calls[].index`, `function.parsed_arguments`); LiteLLM's Message adds `provider_specific_fields` and others.
The server must accept them, ignore them (the prompt is exactly the one without them), and still refuse what would
change the answer (an `audio` or `function_call` with a value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pydantic
import pytest

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for

QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
JSON_ANSWER = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>" \
              '{"city":"Paris","degrees":18}<|return|>'


class Weather(pydantic.BaseModel):
    city: str
    degrees: int


class get_weather(pydantic.BaseModel):  # the tool's name, as pydantic_function_tool takes it
    city: str


def plain(message: dict[str, Any]) -> dict[str, Any]:
    """The message as a careful client writes it: role, content, reasoning, tool calls, nothing else."""
    kept = {key: message[key] for key in ("role", "content", "reasoning") if message.get(key) is not None}
    if message.get("tool_calls"):
        kept["tool_calls"] = [{"id": call["id"], "type": "function",
                               "function": {"name": call["function"]["name"],
                                            "arguments": call["function"]["arguments"]}}
                              for call in message["tool_calls"]]
    return kept


def prompt_of(server: LiveServer, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
    """The prompt tokens the server renders for these messages (POST /tokenize, the same renderer)."""
    response = httpx.post(server.base_url + "/tokenize", timeout=30,
                          json={"model": MODEL, "messages": messages, **extra})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def tool_result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny, 18 degrees"}


def test_model_dump_of_a_tool_call_reply_goes_back_unchanged(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    client = client_for(server)
    reply = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=[WEATHER])
    echoed = reply.choices[0].message.model_dump()
    assert {"annotations", "audio", "function_call", "refusal"} <= echoed.keys()  # the SDK really writes them
    call_id = echoed["tool_calls"][0]["id"]
    # `name` on the tool message, as LiteLLM and vLLM's examples write it
    messages = [QUESTION, echoed, {**tool_result(call_id), "name": "get_weather"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == "It is 18C."
    expected = prompt_of(server, [QUESTION, plain(echoed), tool_result(call_id)], tools=[WEATHER])
    assert engine.requests[1].prompt_token_ids == expected
    prompt = vocab.decode(expected)
    assert 'to=functions.get_weather' in prompt and "sunny, 18 degrees" in prompt and "Need the weather." in prompt


def test_the_message_object_itself_goes_back(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=[CALL, ANSWER])
    client = client_for(server)
    reply = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=[WEATHER])
    message = reply.choices[0].message
    messages: list[Any] = [QUESTION, message, tool_result(message.tool_calls[0].id)]
    assert client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER]).choices[0].message.content


def test_stream_helper_messages_with_index_and_parsed_arguments_go_back(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    client = client_for(server)
    tool = openai.pydantic_function_tool(get_weather)
    with client.chat.completions.stream(model=MODEL, messages=[QUESTION], tools=[tool]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    echoed = final.choices[0].message.model_dump()
    call = echoed["tool_calls"][0]
    assert call["index"] == 0 and call["function"]["parsed_arguments"] == {"city": "Paris"} and "parsed" in echoed
    with client.chat.completions.stream(model=MODEL, messages=[QUESTION, echoed, tool_result(call["id"])],
                                        tools=[tool]) as stream:
        for _ in stream:
            pass
        assert stream.get_final_completion().choices[0].message.content == "It is 18C."
    expected = prompt_of(server, [QUESTION, plain(echoed), tool_result(call["id"])], tools=[tool])
    assert engine.requests[1].prompt_token_ids == expected


# model_dump() of a parsed message warns that `parsed` holds a model where its type says None: the SDK's own doing.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_parse_helper_messages_with_parsed_content_go_back(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [JSON_ANSWER]))
    server = serve(engine=engine)
    client = client_for(server)
    reply = client.chat.completions.parse(model=MODEL, messages=[QUESTION], response_format=Weather)
    echoed = reply.choices[0].message.model_dump()
    assert echoed["parsed"] == {"city": "Paris", "degrees": 18}
    follow_up = {"role": "user", "content": "And tomorrow?"}
    again = client.chat.completions.parse(model=MODEL, messages=[QUESTION, echoed, follow_up], response_format=Weather)
    assert again.choices[0].message.parsed == Weather(city="Paris", degrees=18)
    client.chat.completions.parse(model=MODEL, messages=[QUESTION, plain(echoed), follow_up], response_format=Weather)
    assert engine.requests[1].prompt_token_ids == engine.requests[2].prompt_token_ids


def test_every_client_annotation_is_ignored(serve: Callable[..., LiveServer]) -> None:
    """Each SDK's additions, field by field: the prompt is the one without them."""
    server = serve(completions=[ANSWER])
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    assistant = {"role": "assistant", "content": None, "reasoning_content": "Need the weather.", "tool_calls": [call]}
    plain_prompt = prompt_of(server, [QUESTION, assistant, tool_result("call_1")], tools=[WEATHER])
    annotated_messages = {
        "openai model_dump": {"annotations": None, "audio": None, "function_call": None, "refusal": None},
        "openai web search citations": {"annotations": [{"type": "url_citation", "url_citation": {
            "url": "https://example.com", "title": "x", "start_index": 0, "end_index": 1}}]},
        "openai parse helper": {"parsed": None},
        "LiteLLM Message": {"provider_specific_fields": {"refusal": None, "reasoning_content": "Need the weather."},
                            "thinking_blocks": None, "reasoning_items": None, "images": None},
        "LiteLLM thinking blocks": {"thinking_blocks": [{"type": "thinking", "thinking": "Need the weather."}]},
        "empty lists": {"images": [], "annotations": []},
    }
    for name, extra in annotated_messages.items():
        messages = [QUESTION, {**assistant, **extra}, tool_result("call_1")]
        assert prompt_of(server, messages, tools=[WEATHER]) == plain_prompt, name
    annotated_calls = {
        "openai stream helper": {"index": 0},
        "AI SDK Gemini signature": {"extra_content": {"google": {"thought_signature": "abc"}}},
    }
    for name, extra in annotated_calls.items():
        messages = [QUESTION, {**assistant, "tool_calls": [{**call, **extra}]}, tool_result("call_1")]
        assert prompt_of(server, messages, tools=[WEATHER]) == plain_prompt, name
    parsed_arguments = {**call, "function": {**call["function"], "parsed_arguments": {"city": "Paris"}}}
    messages = [QUESTION, {**assistant, "tool_calls": [parsed_arguments]}, tool_result("call_1")]
    assert prompt_of(server, messages, tools=[WEATHER]) == plain_prompt
    named = {**tool_result("call_1"), "name": "get_weather"}
    assert prompt_of(server, [QUESTION, assistant, named], tools=[WEATHER]) == plain_prompt
    cached = {"role": "user", "content": [{"type": "text", "text": QUESTION["content"],
                                           "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}}]}
    assert prompt_of(server, [cached, assistant, tool_result("call_1")], tools=[WEATHER]) == plain_prompt


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"audio": {"id": "audio_abc123"}}, "messages[1].audio"),
        ({"function_call": {"name": "get_weather", "arguments": "{}"}}, "messages[1].function_call"),
        ({"images": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}, "messages[1].images"),
    ],
)
def test_message_fields_with_a_value_that_would_change_the_answer_are_refused(
    serve: Callable[..., LiveServer], extra: dict[str, Any], param: str
) -> None:
    server = serve(completions=[ANSWER])
    messages = [QUESTION, {"role": "assistant", "content": "Sunny.", **extra}, {"role": "user", "content": "Thanks"}]
    response = httpx.post(server.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": messages},
                          timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_parameter"
    assert "Unrecognized" not in error["message"]


def test_responses_output_items_go_back_as_input(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """The stateless Responses loop: `input += [item.model_dump() for item in response.output]` (which writes
    `async_`, `caller`, `namespace` as null, `phase`, `annotations`, `logprobs`), and the items themselves."""
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER, CALL, ANSWER]))
    server = serve(engine=engine)
    client = client_for(server)
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    prompts = []
    for dump in (True, False):
        first = client.responses.create(model=MODEL, input=[QUESTION], tools=[tool], store=False)
        call = next(item for item in first.output if item.type == "function_call")
        items: list[Any] = [item.model_dump() for item in first.output] if dump else list(first.output)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 degrees"}
        second = client.responses.create(model=MODEL, input=[QUESTION, *items, output], tools=[tool], store=False)
        assert second.output_text == "It is 18C."
        prompt = vocab.decode(engine.requests[-1].prompt_token_ids)
        prompts.append(prompt.replace(call.call_id, "CALL"))
        assert "to=functions.get_weather" in prompt and "sunny, 18 degrees" in prompt
    dumped_call = next(item.model_dump() for item in first.output if item.type == "function_call")
    assert {"async_", "caller", "namespace"} <= dumped_call.keys()
    assert prompts[0] == prompts[1]


def test_strict_sdk_validation_accepts_every_answer(serve: Callable[..., LiveServer]) -> None:
    """openai-python's strict mode checks every required field: `message.refusal` (chat) and
    `usage.input_tokens_details.cache_write_tokens` (Responses, required since 2.45)."""
    server = serve(completions=[ANSWER])
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30,
                           _strict_response_validation=True)
    chat = client.chat.completions.create(model=MODEL, messages=[QUESTION])
    assert chat.choices[0].message.refusal is None and chat.choices[0].message.content == "It is 18C."
    chunks = list(client.chat.completions.create(model=MODEL, messages=[QUESTION], stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None
    response = client.responses.create(model=MODEL, input="hi", store=False)
    assert response.usage.input_tokens_details.cache_write_tokens == 0 and response.service_tier == "default"
    events = list(client.responses.create(model=MODEL, input="hi", stream=True, store=False))
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.input_tokens_details.cache_write_tokens == 0


@pytest.mark.parametrize("tier", ["auto", "default", "flex", "priority", "fast", "ultrafast"])
def test_service_tier_is_checked_and_reported_as_used(serve: Callable[..., LiveServer], tier: str) -> None:
    server = serve(completions=[ANSWER])
    body = httpx.post(server.base_url + "/v1/responses", timeout=30,
                      json={"model": MODEL, "input": "hi", "service_tier": tier}).json()
    assert body["service_tier"] == "default"  # what served it, whatever was asked (the spec allows that)
    chat_tier = "auto" if tier == "ultrafast" else tier  # Chat Completions has no ultrafast tier
    chat = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": [QUESTION], "service_tier": chat_tier})
    assert chat.status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_an_unknown_service_tier_is_refused(serve: Callable[..., LiveServer], path: str) -> None:
    server = serve(completions=[ANSWER])
    body = {"model": MODEL, "service_tier": "turbo", "messages": [QUESTION], "input": "hi"}
    body.pop("input" if path.endswith("completions") else "messages")
    response = httpx.post(server.base_url + path, json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "service_tier" and "'flex'" in response.json()["error"]["message"]
