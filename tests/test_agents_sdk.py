"""The openai-agents SDK running a two-step function-tool loop against the real server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL

set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI


def weather_agent(model: Any, calls: list[str]) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"sunny, 18 degrees in {city}"

    return Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=model)


@pytest.mark.parametrize("api", ["responses", "responses-streamed", "chat"])
def test_two_step_tool_loop(serve: Callable[..., LiveServer], vocab: Any, api: str) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    # Over Chat Completions the SDK replays chain of thought only from the `reasoning` field, the default (README).
    server = serve(engine=engine)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    if api == "chat":
        model: Any = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    else:
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
    calls: list[str] = []
    agent = weather_agent(model, calls)

    async def run() -> Any:
        if api == "responses-streamed":
            result = Runner.run_streamed(agent, "What is the weather in Paris?")
            async for _ in result.stream_events():
                pass
            return result
        return await Runner.run(agent, "What is the weather in Paris?")

    result = asyncio.run(run())
    assert calls == ["Paris"]
    assert result.final_output == "It is 18C."
    assert len(engine.requests) == 2
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert "Answer with the weather tool." in second_prompt
    assert 'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>' in second_prompt
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 18 degrees in Paris" \
        in second_prompt
    # The agent replayed the first turn's reasoning; the tool loop is still going, so the model sees it.
    assert "<|channel|>analysis<|message|>Need the weather.<|end|>" in second_prompt
