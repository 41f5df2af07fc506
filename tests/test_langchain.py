"""LangChain's ChatOpenAI (langchain-openai) running a two-turn tool loop against the real server.

Over Chat Completions ChatOpenAI reads only OpenAI's own fields, so reasoning shows as a token count in
`usage_metadata`, never as text; over the Responses API (`use_responses_api=True`) it shows the reasoning in the
message's content blocks, and when streaming only from summary events (asked with `reasoning.summary`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL

TOOL_RESULT = (
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 18 degrees in Paris<|end|>"
)
FIRST_REASONING = "<|channel|>analysis<|message|>Need the weather.<|end|>"


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny, 18 degrees in {city}"


def weather_model(server: LiveServer, **options: Any) -> Any:
    chat = ChatOpenAI(model=MODEL, base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30,
                      **options)
    return chat.bind_tools([get_weather])


def ask(model: Any, messages: list[BaseMessage], stream: bool) -> AIMessage:
    """One turn, invoked or streamed; a stream's chunks are added up as LangChain's own loops do."""
    if not stream:
        return model.invoke(messages)
    total = None
    for chunk in model.stream(messages):
        total = chunk if total is None else total + chunk
    assert total is not None
    return total


def reasoning_of(message: AIMessage) -> list[str]:
    return [block.get("reasoning", "") for block in message.content_blocks if block["type"] == "reasoning"]


def two_turns(server: LiveServer, stream: bool, **options: Any) -> tuple[AIMessage, AIMessage]:
    """The tool loop: ask, run the tool the model called, send back the AIMessage and a ToolMessage, ask again."""
    model = weather_model(server, **options)
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
    call = ask(model, messages, stream)
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert call.tool_calls[0]["id"].startswith("call_") and call.invalid_tool_calls == []
    messages += [call, get_weather.invoke(call.tool_calls[0])]
    answer = ask(model, messages, stream)
    assert answer.text == "It is 18C." and answer.tool_calls == []
    return call, answer


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_chat_completions_tool_loop(serve: Callable[..., LiveServer], vocab: Any, stream: bool) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    call, answer = two_turns(server, stream, stream_usage=True, reasoning_effort="low")
    assert call.response_metadata["finish_reason"] == "tool_calls"
    assert answer.response_metadata["finish_reason"] == "stop"
    # ChatOpenAI drops `reasoning_content` (it reads OpenAI's fields only); the reasoning shows as a count.
    assert reasoning_of(call) == [] and "reasoning_content" not in call.additional_kwargs
    assert call.usage_metadata["output_token_details"]["reasoning"] == len(vocab.encode("Need the weather."))
    assert answer.usage_metadata["output_token_details"]["reasoning"] == len(vocab.encode("Easy."))

    assert len(engine.requests) == 2
    assert all("Reasoning: low" in vocab.decode(request.prompt_token_ids) for request in engine.requests)
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    # LangChain sends the arguments back re-serialized by json.dumps; the model sees them as sent.
    assert 'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>' in second_prompt
    assert TOOL_RESULT in second_prompt
    assert FIRST_REASONING not in second_prompt  # never received, so never sent back


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_responses_api_tool_loop(serve: Callable[..., LiveServer], vocab: Any, stream: bool) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    # What users pass to OpenAI for reasoning models; the summary, asked here, is what LangChain shows.
    call, answer = two_turns(server, stream, use_responses_api=True, reasoning={"effort": "low", "summary": "auto"})
    assert reasoning_of(call) == ["Need the weather."]
    assert reasoning_of(answer) == ["Easy."]
    assert answer.response_metadata["status"] == "completed" and answer.id.startswith("resp_")
    assert call.usage_metadata["output_token_details"]["reasoning"] == len(vocab.encode("Need the weather."))

    assert len(engine.requests) == 2
    assert all("Reasoning: low" in vocab.decode(request.prompt_token_ids) for request in engine.requests)
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert 'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>' in second_prompt
    assert TOOL_RESULT in second_prompt
    # The reasoning item went back with the call, so the model keeps its chain of thought through the tool loop.
    assert FIRST_REASONING in second_prompt


def test_responses_stream_without_summary_events_keeps_the_loop_working(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    # By default the server streams reasoning as `response.reasoning_text.*`, which LangChain does not read: the
    # reasoning is missing from the streamed message (and so from the replay), but nothing else is.
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    call, answer = two_turns(server, True, use_responses_api=True)
    assert reasoning_of(call) == [""] and reasoning_of(answer) == [""]
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert TOOL_RESULT in second_prompt and FIRST_REASONING not in second_prompt
