"""The Responses API of late 2026, through the real server and the mock engine, sent by the openai SDK (its types
are the shapes): a namespace without a description, `tool_search`, `reasoning.context`, `prompt_cache_options.prewarm`
over HTTP, `configuration_update` items (HTTP, stored chains and a WebSocket continuation), and the refusals of the
multi-agent beta and asynchronous tool calls. Effort `max` is in tests/test_reasoning_controls.py, steering in
tests/test_steering.py, the field walk of the SDK's types in tests/test_spec_fields.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from parsers.vocab import Vocab
from proxy.engines.mock import mock_engine
from proxy.responses.request.schema import TOOL_SEARCH_NOTE
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.grammars import session_matchers
from tests.test_e2e_chat import client_for
from tests.test_websocket import TERMINAL, TOOLS, http_events

COLLABORATION = {"type": "namespace", "name": "collaboration", "tools": []}  # what Codex >= 0.154 sends
CRM = {"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "find_customer",
                                                     "parameters": {"type": "object", "properties": {}}}]}
QUESTION = {"role": "user", "content": "Weather in Paris?"}
EARLIER = [QUESTION, {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                                         "text": "Earlier thoughts."}]},
           {"role": "assistant", "content": "It is 18C."}]


@pytest.fixture
def recorded(serve: Callable[..., LiveServer], vocab: Vocab) -> tuple[LiveServer, Recording, openai.OpenAI]:
    engine = Recording(mock_engine(vocab, 0.0, matchers=session_matchers(vocab)))
    server = serve(engine=engine)
    return server, engine, client_for(server)


def prompt(engine: Recording, vocab: Vocab, index: int = -1) -> str:
    return vocab.decode(engine.requests[index].prompt_token_ids)


def test_a_namespace_without_a_description(recorded: tuple[LiveServer, Recording, openai.OpenAI],
                                           vocab: Vocab) -> None:
    """Codex's empty `collaboration` namespace says nothing to the model; a namespace of tools without a
    description is declared without one."""
    _, engine, client = recorded
    response = client.responses.create(model=MODEL, input="Hi", tools=[COLLABORATION, CRM])
    assert response.status == "completed"
    assert [tool.model_dump(exclude_none=True)["name"] for tool in response.tools] == ["collaboration", "crm"]
    text = prompt(engine, vocab)
    assert "collaboration" not in text
    assert "## crm\n\nnamespace crm {\n\ntype find_customer" in text  # no `//` description lines


def test_tool_search_costs_nothing_and_says_so(recorded: tuple[LiveServer, Recording, openai.OpenAI],
                                               vocab: Vocab) -> None:
    _, engine, client = recorded
    plain = client.responses.create(model=MODEL, input="Hi", tools=TOOLS)
    searching = client.responses.create(model=MODEL, input="Hi", tools=[*TOOLS, {"type": "tool_search"}])
    assert searching.status == plain.status == "completed"
    assert engine.requests[-1].prompt_token_ids == engine.requests[-2].prompt_token_ids  # nothing declared for it
    echoed = searching.tools[-1]
    assert echoed.type == "tool_search" and echoed.execution == "server" and echoed.description == TOOL_SEARCH_NOTE
    client_side = client.responses.create(model=MODEL, input="Hi", tools=[*TOOLS, {
        "type": "tool_search", "execution": "client", "description": "Find tools.", "parameters": {"type": "object"}}])
    assert client_side.tools[-1].execution == "client" and client_side.tools[-1].description == "Find tools."


@pytest.mark.parametrize("context", ["all_turns", "current_turn", "auto"])
def test_reasoning_context_is_served_as_gpt_oss_reads_it(
    recorded: tuple[LiveServer, Recording, openai.OpenAI], vocab: Vocab, context: str
) -> None:
    """Every mode is accepted (Codex Lite sends all_turns); the prompt is gpt-oss's own, earlier turns' reasoning
    left out as it was trained, and the response says which mode was used."""
    _, engine, client = recorded
    asked = client.responses.create(model=MODEL, input=[*EARLIER, {"role": "user", "content": "And London?"}],
                                    reasoning={"context": context})  # type: ignore[typeddict-item]
    client.responses.create(model=MODEL, input=[*EARLIER, {"role": "user", "content": "And London?"}])
    assert asked.reasoning is not None and asked.reasoning.context == "current_turn"
    assert engine.requests[-1].prompt_token_ids == engine.requests[-2].prompt_token_ids
    assert "Earlier thoughts." not in prompt(engine, vocab)


def test_prewarm_over_http_generates_nothing_and_is_continued(
    recorded: tuple[LiveServer, Recording, openai.OpenAI], vocab: Vocab
) -> None:
    _, engine, client = recorded
    warm = client.responses.create(model=MODEL, instructions="Be brief.", input="Weather in Paris?",
                                   prompt_cache_options={"prewarm": True})
    assert warm.status == "completed" and warm.output == [] and not engine.requests
    assert warm.usage is not None and warm.usage.input_tokens > 0 and warm.usage.output_tokens == 0
    client.responses.create(model=MODEL, instructions="Be brief.", previous_response_id=warm.id, input="And London?")
    text = prompt(engine, vocab)
    assert text.index("Weather in Paris?") < text.index("And London?")
    with pytest.raises(openai.BadRequestError):  # checked as any request is
        client.responses.create(model=MODEL, input="Hi", max_output_tokens=10**9,
                                prompt_cache_options={"prewarm": True})


def test_a_configuration_update_applies_from_its_point_on(
    recorded: tuple[LiveServer, Recording, openai.OpenAI], vocab: Vocab
) -> None:
    _, engine, client = recorded
    update: dict[str, Any] = {"type": "configuration_update", "reasoning": {"effort": "max"},
                              "text": {"verbosity": "low"}}
    first = client.responses.create(model=MODEL, input=[*EARLIER, update, {"role": "user", "content": "London?"}],
                                    reasoning={"effort": "low"})
    assert "Reasoning: high\n" in prompt(engine, vocab) and "Verbosity: low." in prompt(engine, vocab)
    assert first.reasoning is not None and first.reasoning.effort == "max" and first.text.verbosity == "low"
    # Stored with the chain: the next turn keeps the setting, until another update replaces it.
    client.responses.create(model=MODEL, previous_response_id=first.id, input="Berlin?", reasoning={"effort": "low"})
    assert "Reasoning: high\n" in prompt(engine, vocab)
    lower = {"type": "configuration_update", "reasoning": {"effort": "minimal"}}
    client.responses.create(model=MODEL, previous_response_id=first.id, input=[lower, {"role": "user",
                                                                                      "content": "Rome?"}])
    assert "Reasoning: low\n" in prompt(engine, vocab)
    # An output format from here on: the model is constrained to it.
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    formatted = client.responses.create(model=MODEL, input=[QUESTION, {"type": "configuration_update", "text": {
        "format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}}}])
    assert formatted.text.format.type == "json_schema" and engine.requests[-1].constraint.response_format is not None
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=[QUESTION, {"type": "configuration_update",
                                                               "reasoning": {"effort": "ultra"}}])
    assert refused.value.body["param"].startswith("input[1]")  # type: ignore[index]


def test_a_configuration_update_on_a_websocket_continuation_is_a_full_render(
    serve: Callable[..., LiveServer], vocab: Vocab
) -> None:
    """The effort sits in the system message, at the start of the prompt: the continuation renders the turn that
    changes it in full, token for token as HTTP renders the whole conversation."""
    engine = Recording(mock_engine(vocab, 0.0, matchers=session_matchers(vocab)))
    server = serve(engine=engine)
    update = {"type": "configuration_update", "reasoning": {"effort": "high"}}
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

    async def run() -> list[Any]:
        finals = []
        async with client.responses.connect() as connection:
            for fields in ({"input": "Weather in Paris?"}, {"input": [update, {"role": "user", "content": "London?"}]}):
                previous = {"previous_response_id": finals[-1].response.id} if finals else {}
                await connection.response.create(model=MODEL, store=False, **previous, **fields)  # type: ignore[arg-type]
                async for event in connection:
                    if event.type in TERMINAL:
                        finals.append(event)
                        break
        return finals

    finals = asyncio.run(run())
    assert [final.type for final in finals] == ["response.completed"] * 2
    conversation = [QUESTION, *(item.model_dump(exclude_none=True) for item in finals[0].response.output), update,
                    {"role": "user", "content": "London?"}]
    http_engine = Recording(mock_engine(vocab, 0.0, matchers=session_matchers(vocab)))
    http_events(serve(engine=http_engine, store_path=None), {"model": MODEL, "store": False, "input": conversation})
    assert engine.requests[1].prompt_token_ids == http_engine.requests[0].prompt_token_ids
    assert "Reasoning: high\n" in prompt(engine, vocab, 1) and "Reasoning: medium\n" in prompt(engine, vocab, 0)


def test_the_multi_agent_beta_and_async_tools_are_refused_with_the_reason(
    recorded: tuple[LiveServer, Recording, openai.OpenAI],
) -> None:
    _, _, client = recorded
    with pytest.raises(openai.BadRequestError) as multi:
        client.beta.responses.create(model=MODEL, input="Hi", multi_agent={"enabled": True})
    assert multi.value.body["param"] == "multi_agent" and "sub-agents" in multi.value.body["message"]  # type: ignore[index]
    assert client.beta.responses.create(model=MODEL, input="Hi", multi_agent={"enabled": False}).status == "completed"
    with pytest.raises(openai.BadRequestError) as asynchronous:
        client.responses.create(model=MODEL, input="Hi", tools=[{**TOOLS[0], "async": True}])  # type: ignore[list-item]
    message = asynchronous.value.body["message"]  # type: ignore[index]
    assert asynchronous.value.body["param"] == "tools[0].async" and "<|call|>" in message  # type: ignore[index]


def test_prewarm_on_a_websocket_is_generate_false(serve: Callable[..., LiveServer], vocab: Vocab) -> None:
    """`prompt_cache_options.prewarm` in a WebSocket create pre-warms as `generate: false` does: nothing generated,
    and the next turn extends the pre-warmed prompt."""
    engine = Recording(mock_engine(vocab, 0.0, matchers=session_matchers(vocab)))
    server = serve(engine=engine)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

    async def run() -> list[Any]:
        finals = []
        async with client.responses.connect() as connection:
            for fields in ({"input": [QUESTION], "prompt_cache_options": {"prewarm": True}},
                           {"input": "London too?"}):
                previous = {"previous_response_id": finals[-1].response.id} if finals else {}
                await connection.response.create(model=MODEL, store=False, instructions="Be brief.", **previous,
                                                 **fields)  # type: ignore[arg-type]
                async for event in connection:
                    if event.type in TERMINAL:
                        finals.append(event)
                        break
        return finals

    warm, answered = asyncio.run(run())
    assert warm.type == answered.type == "response.completed" and warm.response.output == []
    assert len(engine.requests) == 1
    text = prompt(engine, vocab)
    assert text.index("Weather in Paris?") < text.index("London too?")
    usage = warm.response.usage
    assert usage is not None and 0 < usage.input_tokens < len(engine.requests[0].prompt_token_ids)
