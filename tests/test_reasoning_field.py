"""Which Chat Completions reasoning field serves which client: the measurement behind `--reasoning-field`'s default.

Each client runs a two-turn tool loop over Chat Completions (the scripted engine writes reasoning and a call,
then reasoning and the answer) under `reasoning_content`, `reasoning` and `both`; the table records whether the
client shows the first turn's reasoning and whether it sends it back with the tool result, so that the model
keeps its chain of thought through the loop. The README's table is this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agents import OpenAIChatCompletionsModel, Runner
from openai import AsyncOpenAI

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_agents_sdk import weather_agent
from tests.test_ai_sdk import node_modules, run_script  # noqa: F401  (node_modules: a fixture)
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for
from tests.test_langchain import reasoning_of, two_turns
from tests.test_litellm import QUESTION, complete, litellm  # noqa: F401  (litellm: a fixture)

FIELDS = ["reasoning_content", "reasoning", "both"]
FIRST_REASONING = "<|channel|>analysis<|message|>Need the weather.<|end|>"
Outcome = tuple[bool, bool]  # (the client shows the reasoning, the client sends it back in the tool loop)


def openai_sdk(server: LiveServer, read: str) -> bool:
    """The README's example: read the field as an attribute of the message, then send the message back dumped."""
    client = client_for(server)
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER])
    message = first.choices[0].message
    shown = getattr(message, read, None) == "Need the weather."
    call = message.tool_calls[0]
    client.chat.completions.create(model=MODEL, tools=[WEATHER], messages=[
        *QUESTION, message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 18 degrees"}])
    return shown


def openai_agents(server: LiveServer) -> bool:
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0))
    result = asyncio.run(Runner.run(weather_agent(model, []), "What is the weather in Paris?"))
    assert result.final_output == "It is 18C."
    return any(getattr(item, "type", "") == "reasoning_item" for item in result.new_items)


def langchain(server: LiveServer, stream: bool) -> bool:
    call, _ = two_turns(server, stream)
    return reasoning_of(call) == ["Need the weather."] or "Need the weather." in str(call.additional_kwargs)


def litellm_openai(server: LiveServer, module: ModuleType) -> bool:
    first = complete(module, server, QUESTION).choices[0].message
    shown = getattr(first, "reasoning_content", None) == "Need the weather."
    call = first.tool_calls[0]
    complete(module, server, [*QUESTION, first, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    return shown


def ai_sdk(server: LiveServer, provider: str) -> bool:
    output = run_script(server, provider, "generate")
    assert output["error"] is None, output["error"]
    return output["result"]["steps"][0]["reasoning"] == "Need the weather."


CLIENTS: dict[str, Callable[..., bool]] = {
    "openai SDK, reading `message.reasoning_content`": lambda server, **_: openai_sdk(server, "reasoning_content"),
    "openai SDK, reading `message.reasoning` (OpenAI's gpt-oss guide)": lambda server, **_: openai_sdk(
        server, "reasoning"),
    "openai-agents, OpenAIChatCompletionsModel": lambda server, **_: openai_agents(server),
    "LangChain ChatOpenAI, invoke": lambda server, **_: langchain(server, False),
    "LangChain ChatOpenAI, stream": lambda server, **_: langchain(server, True),
    "LiteLLM, openai/ provider": lambda server, module, **_: litellm_openai(server, module),
    "AI SDK, @ai-sdk/openai-compatible": lambda server, **_: ai_sdk(server, "openai-compatible"),
    "AI SDK, @ai-sdk/openai chat": lambda server, **_: ai_sdk(server, "openai-chat"),
}

# (shows, sends back) per client, under reasoning_content, reasoning and both, as measured (README). openai-agents
# prefers `reasoning_content` when a message has both, and takes it for a summary it does not replay.
Y, N = True, False
TABLE: dict[str, tuple[Outcome, Outcome, Outcome]] = {
    "openai SDK, reading `message.reasoning_content`": ((Y, Y), (N, Y), (Y, Y)),
    "openai SDK, reading `message.reasoning` (OpenAI's gpt-oss guide)": ((N, Y), (Y, Y), (Y, Y)),
    "openai-agents, OpenAIChatCompletionsModel": ((Y, N), (Y, Y), (Y, N)),
    "LangChain ChatOpenAI, invoke": ((N, N), (N, N), (N, N)),
    "LangChain ChatOpenAI, stream": ((N, N), (N, N), (N, N)),
    "LiteLLM, openai/ provider": ((Y, Y), (Y, Y), (Y, Y)),
    "AI SDK, @ai-sdk/openai-compatible": ((Y, Y), (Y, Y), (Y, Y)),
    "AI SDK, @ai-sdk/openai chat": ((N, N), (N, N), (N, N)),
}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("client", list(CLIENTS))
def test_reasoning_field_per_client(
    serve: Callable[..., LiveServer], vocab: Any, litellm: ModuleType, node_modules: Path,  # noqa: F811 (fixtures)
    client: str, field: str,
) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine, reasoning_field=field)
    shown = CLIENTS[client](server, module=litellm)
    assert len(engine.requests) == 2
    sent_back = FIRST_REASONING in vocab.decode(engine.requests[1].prompt_token_ids)
    assert (shown, sent_back) == TABLE[client][FIELDS.index(field)]


def test_the_default_serves_the_most_clients() -> None:
    """The default field is the one under which the most clients send the reasoning back (the model keeps its
    chain of thought through tool loops: what gpt-oss was trained on), then the most show it."""
    from proxy.config import ServerConfig

    def score(field: str) -> tuple[int, int]:
        outcomes = [row[FIELDS.index(field)] for row in TABLE.values()]
        return sum(sent for _, sent in outcomes), sum(shown for shown, _ in outcomes)

    assert max(FIELDS, key=score) == ServerConfig.reasoning_field == "reasoning"
