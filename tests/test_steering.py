"""`response.steer` over the SDK's `client.beta.responses.connect()`: a steer stops the running response at a token
boundary (`incomplete`, reason `steered`) and a successor continues it with the steer's input, its prompt extending
the steered response's tokens, token for token what a full render of the same conversation gives. A steer that
arrives while a tool call is written waits (`response.steer.pending`) and goes first into the next create."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from openai import AsyncOpenAI
from openai.types.beta import (
    BetaResponseIncompleteEvent,
    BetaResponseSteerAcceptedEvent,
    BetaResponseSteerFailedEvent,
    BetaResponseSteerPendingEvent,
)

from benchmarks.sealed_replay import rss_kib
from proxy.engines.scripted import scripted_engine
from proxy.responses import steering
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL
from tests.test_store_processes import ServerProcess
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
        event = await connection.recv()
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


def test_a_connections_steers_are_bounded_in_bytes() -> None:
    """Queued and held steers count against one budget (the connection's turns' budget); past it, a steer fails
    and nothing is kept; what a response takes, or a create commits, goes back to the budget."""
    small, big = steering.read_steer({"type": "response.steer", "previous_response_id": "resp_a", "input": "x"}), \
        steering.read_steer({"type": "response.steer", "previous_response_id": "resp_a", "input": "y" * 4000})
    steers = steering.Steers(max_bytes=10_000)
    steers.queue(big)
    steers.queue(big)
    with pytest.raises(steering.SteerError) as refused:
        steers.queue(big)
    assert refused.value.code == "steer_budget_exceeded" and "MiB" in refused.value.message
    steers.queue(small)
    assert big.size > 4000 and steers.used == 2 * big.size + small.size
    assert steers.hold("resp_a", steers.take("resp_a")) == [] and steers.used == 2 * big.size + small.size
    continued = steers.held_input({"previous_response_id": "resp_a", "input": "done"})
    assert len(continued["input"]) == 4 and steers.used == 0


def test_steers_past_the_budget_fail_and_the_server_stays_small(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """16 steers of 4 MiB sent at a response writing a tool call (held for the create that brings its output). Before:
    all 16 accepted and held, 64 MiB kept per response, 4 GiB per connection (32 responses); now those past the
    connection's budget fail with `steer_budget_exceeded`, and the process keeps no more than that. The control,
    first on the same connection: the same 16 steers sent to no response, all failed, none kept. Strings this
    large are given back to the system when freed (glibc's mmap threshold fixed at 1 MiB: left to itself, it
    rises after the first free and keeps them on the heap), so RSS shows what is kept."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": CALL.replace("Paris", "Paris" + ", France" * 400)}) + "\n")
    server = ServerProcess(script, tmp_path / "store.sqlite3", tmp_path / "server.log", "--token-delay-ms", "20")
    big = "Actually, London. " + "x" * (4 << 20)
    grew: dict[str, int] = {}

    async def steer_16(socket: Any, target: str) -> list[dict[str, Any]]:
        for _ in range(16):
            await socket.send(json.dumps({"type": "response.steer", "input": big, "previous_response_id": target}))
        answers = []
        while len(answers) < 16:
            event = json.loads(await socket.recv())
            if event["type"] in ("response.steer.pending", "response.steer.failed"):
                answers.append(event)
        return answers

    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(server.url.replace("http://", "ws://") + "/v1/responses",
                                      max_size=None) as socket:
            before = rss_kib(server.process.pid)
            assert {event["error"]["code"] for event in await steer_16(socket, "resp_nothing")} == {
                "response_not_found"}
            grew["control"] = rss_kib(server.process.pid) - before
            await socket.send(json.dumps({"type": "response.create", **SETTINGS, "input": "Weather in Paris?"}))
            events = [json.loads(await socket.recv())]
            while not (events[-1]["type"] == "response.output_item.added"
                       and events[-1]["item"]["type"] == "function_call"):
                events.append(json.loads(await socket.recv()))
            answers = await steer_16(socket, events[0]["response"]["id"])
            grew["steered"] = rss_kib(server.process.pid) - before
            return answers

    try:
        httpx.get(server.url + "/health", timeout=30)
        answers = asyncio.run(run())
    finally:
        server.stop()
    kinds = [answer["type"] for answer in answers]
    budget = steering.MAX_BYTES
    kept = kinds.count("response.steer.pending")
    print(f"\n16 steers of 4 MiB: {kept} held, {kinds.count('response.steer.failed')} failed; the server's RSS grew "
          f"{grew['steered'] / 1024:.0f} MiB (control, none held: {grew['control'] / 1024:.0f} MiB; budget "
          f"{budget >> 20} MiB)")
    assert 0 < kept < 16 and kept * len(big) <= budget
    assert {answer["error"]["code"] for answer in answers if answer["type"] == "response.steer.failed"} == {
        "steer_budget_exceeded"}
    assert grew["control"] * 1024 < budget  # what is not held is not kept
    assert grew["steered"] * 1024 < 2 * budget  # before: 16 x 4 MiB held
