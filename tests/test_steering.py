"""`response.steer` over the SDK's `client.beta.responses.connect()`: a steer stops the running response at a token
boundary (`incomplete`, reason `steered`) and a successor continues it with the steer's input, its prompt extending
the steered response's tokens, token for token what a full render of the same conversation gives. A steer that
arrives while a tool call is written waits (`response.steer.pending`) and goes first into the next create."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from openai import AsyncOpenAI
from openai.types.beta import (
    BetaResponseIncompleteEvent,
    BetaResponseSteerAcceptedEvent,
    BetaResponseSteerFailedEvent,
    BetaResponseSteerPendingEvent,
)

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL
from tests.test_websocket import TOOLS, http_events

THINKING = ("<|channel|>analysis<|message|>" + " ".join(f"Step {n} of checking the forecast." for n in range(80))
            + "<|end|><|start|>assistant<|channel|>final<|message|>It is 18C.<|return|>")
STEER = "Actually, answer for London instead."
SETTINGS = {"model": MODEL, "tools": TOOLS, "store": False, "instructions": "Be brief."}
DONE = {"response.completed", "response.incomplete", "response.failed", "response.cancelled", "error"}


def connect(server: LiveServer) -> Any:
    return AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0).beta.responses.connect()


async def until(connection: Any, events: list[Any], done: Callable[[Any], bool]) -> Any:
    while True:
        event = await asyncio.wait_for(connection.recv(), 20)
        events.append(event)
        if done(event):
            return event


async def steer_once(connection: Any, events: list[Any], when: Callable[[Any], bool], steer: Any) -> str:
    """Create a response, steer it once `when` an event says so; the steered response's id."""
    await connection.response.create(input="Weather in Paris?", **SETTINGS)
    await until(connection, events, when)
    target: str = events[0].response.id
    await connection.response.steer(input=steer, previous_response_id=target)
    return target


def answer(response: Any) -> str:
    return "".join(part.text for item in response.output if item.type == "message" for part in item.content)


def test_a_steer_stops_the_response_and_its_successor_extends_its_tokens(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    engine = Recording(scripted_engine(vocab, [THINKING, ANSWER], token_delay=0.01))
    server = serve(engine=engine)

    async def run() -> list[Any]:
        events: list[Any] = []
        async with connect(server) as connection:
            await steer_once(connection, events, lambda event: event.type == "response.reasoning_text.delta", STEER)
            await until(connection, events, lambda event: event.type == "response.completed")
        return events

    events = asyncio.run(run())
    kinds = [event.type for event in events]
    accepted = BetaResponseSteerAcceptedEvent.model_validate(events[kinds.index("response.steer.accepted")].to_dict())
    stopped = BetaResponseIncompleteEvent.model_validate(events[kinds.index("response.incomplete")].to_dict())
    steered = stopped.response
    assert accepted.steer.previous_response_id == steered.id and accepted.steer.id.startswith("steer_")
    assert kinds.index("response.steer.accepted") < kinds.index("response.incomplete")
    assert steered.incomplete_details is not None and steered.incomplete_details.reason == "steered"
    assert steered.output and steered.output[0].type == "reasoning" and steered.output[0].status == "incomplete"
    assert "It is 18C." not in str(steered.output)  # stopped inside its reasoning
    assert engine.cancelled.is_set()  # the engine's request was closed, not left to finish
    # The successor: created automatically, continuing the steered response with the steer's input.
    created = [event for event in events if event.type == "response.created"]
    assert len(created) == 2 and created[1].response.previous_response_id == steered.id
    assert answer(events[-1].response) == "It is 18C."
    assert [event.sequence_number for event in events[kinds.index("response.created", 1):]] == \
        list(range(len(events) - kinds.index("response.created", 1)))
    # Token for token what a full render of the same conversation gives (stateless HTTP, sent at once).
    conversation = [{"role": "user", "content": "Weather in Paris?"},
                    *(item.model_dump(exclude_none=True) for item in steered.output),
                    {"role": "user", "content": STEER}]
    http_engine = Recording(scripted_engine(vocab, [ANSWER]))
    http_server = serve(engine=http_engine, store_path=None)
    http_events(http_server, {**SETTINGS, "input": conversation})
    assert len(engine.requests) == 2
    assert engine.requests[1].prompt_token_ids == http_engine.requests[0].prompt_token_ids
    # The steered response's prompt is the successor's prefix: nothing before the new turn was rendered again.
    assert engine.requests[1].prompt_token_ids[:len(engine.requests[0].prompt_token_ids) - 3] == \
        engine.requests[0].prompt_token_ids[:-3]


def test_a_steer_during_a_tool_call_waits_for_its_output(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """The response ends with its call (no boundary inside a call); the steer is pending, with a stub of the output
    the client owes, and goes first into the input of the create that brings it."""
    slow_call = CALL.replace("Paris", "Paris" + ", France" * 60)  # time for the steer while the call is written
    engine = Recording(scripted_engine(vocab, [slow_call, ANSWER], token_delay=0.01))
    server = serve(engine=engine)

    async def run() -> list[Any]:
        events: list[Any] = []
        async with connect(server) as connection:
            target = await steer_once(connection, events, lambda event: event.type == "response.output_item.added"
                                      and event.item.type == "function_call", [{"role": "user", "content": STEER}])
            await until(connection, events, lambda event: event.type == "response.steer.pending")
            call = next(item for item in events[-2].response.output if item.type == "function_call")
            await connection.response.create(previous_response_id=target, **SETTINGS, input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
            await until(connection, events, lambda event: event.type in DONE and event.type != "response.incomplete"
                        and event.response.id != target)
        return events

    events = asyncio.run(run())
    kinds = [event.type for event in events]
    assert kinds.count("response.created") == 2 and "response.incomplete" not in kinds
    completed = events[kinds.index("response.completed")]
    pending = BetaResponseSteerPendingEvent.model_validate(events[kinds.index("response.steer.pending")].to_dict())
    assert kinds.index("response.completed") < kinds.index("response.steer.pending")
    assert pending.reason == "waiting_for_required_input"
    call = next(item for item in completed.response.output if item.type == "function_call")
    assert [stub.model_dump() for stub in pending.required_input] == [
        {"type": "function_call_output", "call_id": call.call_id, "name": "get_weather"}]
    assert events[-1].type == "response.completed" and answer(events[-1].response) == "It is 18C."
    second = vocab.decode(engine.requests[1].prompt_token_ids)
    assert second.index(STEER) < second.index("sunny")  # the steer first, then the output the create brought


def test_steers_that_cannot_be_taken_fail_with_their_input(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=scripted_engine(vocab, [ANSWER]))

    async def run() -> list[Any]:
        events: list[Any] = []
        async with connect(server) as connection:
            await connection.response.steer(input="Hello?", previous_response_id="resp_nothing")
            await until(connection, events, lambda event: event.type == "response.steer.failed")
            await connection.response.create(input="Weather in Paris?", **SETTINGS)
            await until(connection, events, lambda event: event.type == "response.completed")
            await connection.response.steer(input="Too late.", previous_response_id=events[-1].response.id)
            await until(connection, events, lambda event: event.type == "response.steer.failed")
            await connection.send({"type": "response.steer", "previous_response_id": "resp_x",  # type: ignore[arg-type]
                                   "input": [{"role": "assistant", "content": "No."}]})
            await until(connection, events, lambda event: event.type == "response.steer.failed")
        return events

    failures = [event for event in asyncio.run(run()) if event.type == "response.steer.failed"]
    assert [failure.error.code for failure in failures] == ["response_not_found", "response_already_completed",
                                                            "invalid_input"]
    for failure in failures[:2]:  # the SDK's type holds valid input only
        BetaResponseSteerFailedEvent.model_validate(failure.to_dict())
    assert failures[0].steer.input == "Hello?" and failures[0].steer.id is None
    assert failures[2].steer.input == [{"role": "assistant", "content": "No."}]  # returned as sent
    assert "user" in failures[2].error.message
