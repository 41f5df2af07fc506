"""Chat Completions end to end: the real server on a loopback port, the official openai client."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import openai

from tests.conftest import MODEL, LiveServer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
)
ANSWER = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 18C.<|return|>"


def client_for(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def extra(obj: Any, name: str) -> Any:
    return (obj.model_extra or {}).get(name)


def streamed_answer(stream: Any) -> tuple[dict[str, Any], list[Any]]:
    """Accumulate a chat stream the way client libraries do; also return the raw chunks."""
    chunks = list(stream)
    content, reasoning, calls, finish = [], [], {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append(extra(delta, "reasoning") or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += (call.function.name or "") if call.function else ""
                entry["arguments"] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    answer = {
        "reasoning": "".join(reasoning) or None,
        "content": "".join(content) or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
    }
    return answer, chunks


def message_answer(completion: Any) -> dict[str, Any]:
    message = completion.choices[0].message
    return {
        "reasoning": extra(message, "reasoning"),
        "content": message.content or None,
        "tool_calls": [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []],
        "finish_reason": completion.choices[0].finish_reason,
    }


def test_recorded_completions_streamed_and_not_give_the_expected_answer(
    serve: Callable[..., LiveServer], recorded: list[dict[str, Any]]
) -> None:
    # Each completion is served twice in a row: once for the plain request, once for the streamed one.
    server = serve(completions=[e["completion"] for e in recorded for _ in range(2)])
    client = client_for(server)
    for entry in recorded:
        expected = {**entry["expected"], "content": entry["expected"]["content"] or None}
        messages = [{"role": "user", "content": "go"}]
        plain = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
        streamed, _ = streamed_answer(
            client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], stream=True)
        )
        assert message_answer(plain) == expected, entry["name"]
        assert streamed == expected, entry["name"]


def test_non_streaming_answer_with_usage(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=[ANSWER])
    completion = client_for(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}]
    )
    assert completion.object == "chat.completion" and completion.model == MODEL
    message = completion.choices[0].message
    assert message.role == "assistant" and message.content == "It is 18C." and message.tool_calls is None
    assert extra(message, "reasoning") == "Easy."
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage.completion_tokens == len(vocab.encode_harmony(ANSWER))
    assert usage.completion_tokens_details.reasoning_tokens == len(vocab.encode("Easy."))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is None  # the scripted engine does not know cached tokens


def test_streaming_chunks_and_usage(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[CALL])
    stream = client_for(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        stream=True,
        stream_options={"include_usage": True},
    )
    answer, chunks = streamed_answer(stream)
    assert answer == {
        "reasoning": "Need the weather.",
        "content": None,
        "tool_calls": [{"name": "get_weather", "arguments": '{"city":"Paris"}'}],
        "finish_reason": "tool_calls",
    }
    assert len({(c.id, c.created, c.model, c.object) for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0


def test_stream_helper_reports_content_and_tool_call_events(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[CALL, ANSWER])
    client = client_for(server)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with client.chat.completions.stream(model=MODEL, messages=messages, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds and "tool_calls.function.arguments.done" in kinds
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(model=MODEL, messages=messages) as stream:
        text = "".join(event.delta for event in stream if event.type == "content.delta")
        final = stream.get_final_completion()
    assert text == final.choices[0].message.content == "It is 18C."


def test_two_turn_tool_loop_with_the_mock_engine(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve())
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Please use get_weather for Paris."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME])
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 18 degrees"})
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    # The mock reads its prompt: the tool result reached it under the name resolved from tool_call_id.
    assert "get_weather returned: sunny, 18 degrees" in second.choices[0].message.content
    assert "mock" in second.choices[0].message.content


def test_mock_engine_honours_tool_choice(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve())
    ask = [{"role": "user", "content": "Hello there"}]
    required = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER, TIME], tool_choice="required")
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather"
    named = client.chat.completions.create(
        model=MODEL, messages=ask, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert named.choices[0].message.tool_calls[0].function.name == "get_time"
    mention = [{"role": "user", "content": "call get_time now"}]
    none = client.chat.completions.create(model=MODEL, messages=mention, tools=[WEATHER, TIME], tool_choice="none")
    assert none.choices[0].message.tool_calls is None and "mock" in none.choices[0].message.content


def test_mock_engine_reads_reasoning_effort_from_the_prompt(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve(default_reasoning_effort="low"))
    ask = [{"role": "user", "content": "hi"}]
    default = client.chat.completions.create(model=MODEL, messages=ask)
    assert "reasoning effort low" in extra(default.choices[0].message, "reasoning")
    high = client.chat.completions.create(model=MODEL, messages=ask,
                                          extra_body={"chat_template_args": {"reasoning_effort": "high"}})
    assert "reasoning effort high" in extra(high.choices[0].message, "reasoning")


def test_reasoning_field_option(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], reasoning_field="reasoning_content")
    client = client_for(server)
    message = client.chat.completions.create(model=MODEL,
                                             messages=[{"role": "user", "content": "q"}]).choices[0].message
    assert extra(message, "reasoning_content") == "Easy." and "reasoning" not in (message.model_extra or {})
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}], stream=True))
    fields = {key for c in chunks for choice in c.choices for key in (choice.delta.model_extra or {})}
    assert fields == {"reasoning_content"}


def test_both_reasoning_fields_carry_the_same_text(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve(completions=[ANSWER], reasoning_field="both"))
    ask = [{"role": "user", "content": "q"}]
    message = client.chat.completions.create(model=MODEL, messages=ask).choices[0].message
    assert extra(message, "reasoning") == extra(message, "reasoning_content") == "Easy."
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask, stream=True))
    deltas = [choice.delta.model_extra for chunk in chunks for choice in chunk.choices if choice.delta.model_extra]
    assert deltas and all(delta["reasoning"] == delta["reasoning_content"] for delta in deltas)
    assert "".join(delta["reasoning"] for delta in deltas) == "Easy."
    # Sent back as the SDK dumps it, both fields at once, the reasoning is taken once.
    again = client.chat.completions.create(model=MODEL, messages=[*ask, message.model_dump(exclude_none=True),
                                                                  {"role": "user", "content": "and?"}])
    assert again.choices[0].message.content == "It is 18C."


def test_stop_strings_keep_the_text_before_them(serve: Callable[..., LiveServer]) -> None:
    text = ("<|channel|>analysis<|message|>Say END here.<|end|><|start|>assistant<|channel|>final<|message|>"
            "one two END three<|return|>")
    server = serve(completions=[text])
    client = client_for(server)
    ask = [{"role": "user", "content": "count"}]
    plain = client.chat.completions.create(model=MODEL, messages=ask, stop=["END", "zzz"])
    streamed, _ = streamed_answer(client.chat.completions.create(model=MODEL, messages=ask, stop="END", stream=True))
    assert plain.choices[0].message.content == streamed["content"] == "one two "
    assert extra(plain.choices[0].message, "reasoning") == "Say END here."  # reasoning is not cut
    assert plain.choices[0].finish_reason == streamed["finish_reason"] == "stop"


def test_max_tokens_cuts_with_length(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=[ANSWER])
    client = client_for(server)
    for limit in ("max_tokens", "max_completion_tokens"):
        completion = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}],
                                                    **{limit: 5})
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage.completion_tokens == 5
        assert "<|" not in (completion.choices[0].message.content or "")


def test_parallel_tool_calls_false_keeps_only_the_first_call(serve: Callable[..., LiveServer]) -> None:
    two = (
        '<|channel|>commentary to=functions.get_weather json<|message|>{"city":"A"}<|end|>'
        "<|start|>assistant<|channel|>commentary to=functions.get_time json<|message|>{}<|call|>"
    )
    server = serve(completions=[two])
    client = client_for(server)
    ask = [{"role": "user", "content": "q"}]
    both = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER, TIME])
    assert [(c.function.name, c.id != "") for c in both.choices[0].message.tool_calls] == [
        ("get_weather", True), ("get_time", True)]
    assert len({c.id for c in both.choices[0].message.tool_calls}) == 2
    one = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER, TIME], parallel_tool_calls=False)
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
