"""Structured outputs and required tool calls through the clients that depend on them, end to end on loopback:
the openai SDK's `parse()` helpers with nested pydantic models and openai-agents' `output_type` and
`tool_choice="required"`, on the mock engine (which generates under the compiled grammar) and on the upstream
engine against a fake upstream that runs the grammar it is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field

from proxy.engines.upstream.engine import UpstreamEngine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.fake_upstreams import fake_upstream
from tests.grammars import session_matchers

set_tracing_disabled(True)


class Step(BaseModel):
    n: int = Field(ge=1)
    kind: Literal["do", "check"]


class Person(BaseModel):
    name: str


class Plan(BaseModel):
    title: str
    steps: list[Step]
    owner: Person | None


ASK = [{"role": "user", "content": "Plan a picnic."}]
PLAN = Plan(title="Picnic", steps=[Step(n=1, kind="do"), Step(n=2, kind="check")], owner=Person(name="Ada"))
# What a model writes: reasoning, then the plan as the final answer's JSON, keys in the schema's order.
PLAN_COMPLETION = ("<|channel|>analysis<|message|>Two steps will do.<|end|><|start|>assistant<|channel|>final"
                   f"<|message|>{PLAN.model_dump_json()}<|return|>")


def test_chat_parse_with_nested_models_on_the_mock(serve: Callable[..., LiveServer]) -> None:
    client = OpenAI(base_url=serve().base_url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Plan)
    plan = reply.choices[0].message.parsed
    assert isinstance(plan, Plan) and plan.steps and all(step.n >= 1 for step in plan.steps)
    assert reply.choices[0].message.reasoning  # type: ignore[attr-defined]  # the analysis stayed free
    with client.chat.completions.stream(model=MODEL, messages=ASK, response_format=Plan) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].message.parsed == plan  # the stream gives what the answer gives


def test_responses_parse_with_nested_models_on_the_mock(serve: Callable[..., LiveServer]) -> None:
    client = OpenAI(base_url=serve().base_url + "/v1", api_key="unused", max_retries=0)
    response = client.responses.parse(model=MODEL, input="Plan a picnic.", text_format=Plan)
    assert isinstance(response.output_parsed, Plan)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    with client.responses.stream(model=MODEL, input="Plan a picnic.", text_format=Plan) as stream:
        streamed = stream.get_final_response()
    assert streamed.output_parsed == response.output_parsed


def agents_model(server: LiveServer, api: str) -> Any:
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    if api == "chat":
        return OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    return OpenAIResponsesModel(model=MODEL, openai_client=client)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_output_type_on_the_mock(serve: Callable[..., LiveServer], api: str) -> None:
    engine_server = serve()
    agent = Agent(name="planner", instructions="Plan.", output_type=Plan, model=agents_model(engine_server, api))
    result = asyncio.run(Runner.run(agent, "Plan a picnic."))
    assert isinstance(result.final_output, Plan)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_required_tool_choice_on_the_mock(serve: Callable[..., LiveServer], vocab: Any, api: str) -> None:
    """The user never names the tool, so only the enforced tool choice makes the model call it."""
    from proxy.engines.mock import mock_engine

    engine = Recording(mock_engine(vocab, matchers=session_matchers(vocab)))
    server = serve(engine=engine)
    calls: list[str] = []

    @function_tool
    def lookup_forecast(city: str, days: int) -> str:
        """The forecast for a city."""
        calls.append(f"{city}/{days}")
        return "sunny all week"

    agent = Agent(name="forecaster", instructions="Be helpful.", tools=[lookup_forecast],
                  model=agents_model(server, api), model_settings=ModelSettings(tool_choice="required"))
    result = asyncio.run(Runner.run(agent, "Hello there."))
    assert len(calls) == 1  # one call, with arguments the tool's schema accepts (the SDK validated them)
    first, second = engine.requests
    assert first.constraint.tool_choice.mode == "required" and first.constraint.grammar is not None
    assert second.constraint.tool_choice.mode == "auto"  # the SDK resets it after a call (reset_tool_choice)
    assert "sunny all week" in result.final_output


def constrained_upstream(serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any,
                         completion: str) -> tuple[Any, Recording, LiveServer]:
    """Our server on a fake vLLM that applies llguidance grammars (it runs the grammar it is sent on its script)."""
    upstream_app = fake_upstream(vocab, "vllm", completion)
    upstream = serve_app(upstream_app)
    engine = Recording(UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, "vllm", guided_decoding="llguidance"))
    return upstream_app, engine, serve(engine=engine)


def test_chat_parse_through_an_upstream_that_enforces_the_grammar(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    upstream_app, engine, server = constrained_upstream(serve, serve_app, vocab, PLAN_COMPLETION)
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Plan)
    assert reply.choices[0].message.parsed == PLAN
    sent = upstream_app.state.seen[-1]["structured_outputs"]["grammar"]
    assert sent == engine.requests[-1].constraint.grammar.lark  # the request's own grammar reached the upstream
    assert '"title"' in sent and "<|channel|>" in sent


def test_agents_output_type_through_an_upstream_that_enforces_the_grammar(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    upstream_app, _, server = constrained_upstream(serve, serve_app, vocab, PLAN_COMPLETION)
    agent = Agent(name="planner", instructions="Plan.", output_type=Plan, model=agents_model(server, "responses"))
    result = asyncio.run(Runner.run(agent, "Plan a picnic."))
    assert result.final_output == PLAN
    assert json.loads(json.dumps(upstream_app.state.seen[-1]["structured_outputs"]))["grammar"]


def test_an_upstream_answer_off_the_schema_is_refused_not_passed_on(
    serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Any
) -> None:
    """The fake really enforces: a final answer that breaks the schema never reaches the client as parsed."""
    import openai

    bad = PLAN_COMPLETION.replace('"kind":"check"', '"kind":"maybe"')
    _, _, server = constrained_upstream(serve, serve_app, vocab, bad)
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Plan)
