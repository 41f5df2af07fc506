"""The Responses API over WebSocket (proxy/responses/transport/websocket.py), end to end: the openai SDK's
`responses.connect()`, Codex's message shapes, openai-agents' WebSocket transport, and a raw client for errors,
lanes, cancelling, limits and auth."""

from __future__ import annotations

import asyncio
import json
import socket as socket_module
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets
from openai import AsyncOpenAI

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL

TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL_LONDON = CALL.replace("Paris", "London")
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled", "error"}


def ws_url(server: LiveServer) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/responses"


async def until_done(socket: Any) -> list[dict[str, Any]]:
    """The events of one response (or one error), up to its terminal event."""
    events = []
    while True:
        event = json.loads(await socket.recv())
        events.append(event)
        if event["type"] in TERMINAL:
            return events


def http_events(server: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.base_url + "/v1/responses", json={**body, "stream": True}, timeout=10) as reply:
        return [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]


def shape(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(event["type"], event["sequence_number"]) for event in events]


def test_sdk_tool_loop_on_one_connection(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """responses.connect(): a tool loop, streamed, continued by previous_response_id with store: false; the
    second prompt is, token for token, what HTTP renders for the whole conversation sent at once."""
    engine = Recording(scripted_engine(vocab, [CALL, CALL_LONDON, ANSWER]))
    server = serve(engine=engine)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    turns: list[list[Any]] = []

    async def turn(connection: Any, **fields: Any) -> Any:
        await connection.response.create(model=MODEL, tools=TOOLS, store=False, instructions="Be brief.", **fields)
        events = []
        async for event in connection:
            events.append(event)
            if event.type in TERMINAL:
                break
        turns.append(events)
        return events[-1]

    async def run() -> list[Any]:
        async with client.responses.connect() as connection:
            first = await turn(connection, input="Weather in Paris and London?")
            conversation: list[Any] = [{"role": "user", "content": "Weather in Paris and London?"}]
            finals = [first]
            for city in ("Paris", "London"):
                call = next(item for item in finals[-1].response.output if item.type == "function_call")
                output = {"type": "function_call_output", "call_id": call.call_id, "output": f"sunny in {city}"}
                conversation += [item.model_dump(exclude_none=True) for item in finals[-1].response.output]
                conversation.append(output)
                finals.append(await turn(connection, previous_response_id=finals[-1].response.id, input=[output]))
            return [finals, conversation]

    finals, conversation = asyncio.run(run())
    assert [final.type for final in finals] == ["response.completed"] * 3
    assert finals[-1].response.output_text == "It is 18C."
    assert all(final.response.store is False for final in finals)
    for events in turns:  # numbered from 0 per response, in order, as over SSE
        assert [event.sequence_number for event in events] == list(range(len(events)))
    # The whole conversation over HTTP, stateless: the same prompt tokens and the same events.
    http_engine = Recording(scripted_engine(vocab, [ANSWER]))
    http_server = serve(engine=http_engine, store_path=None)
    events = http_events(http_server, {"model": MODEL, "tools": TOOLS, "store": False, "instructions": "Be brief.",
                                       "input": conversation})
    assert engine.requests[2].prompt_token_ids == http_engine.requests[0].prompt_token_ids
    assert [(t, n) for t, n in shape(events)] == [(e.type, e.sequence_number) for e in turns[2]]


def test_codex_shape_prewarm_then_continue(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """Codex: fields at the top level, `generate: false` first (no generation; Codex 0.169 pre-warms with its
    developer message alone), then the real turn continuing from it with only new items (the user's), then
    `response.processed`; the nested `response` shape works too."""
    engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER]))
    server = serve(engine=engine)
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]}
    codex = {"type": "response.create", "model": MODEL, "instructions": "", "tools": TOOLS, "tool_choice": "auto",
             "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False, "stream": True,
             "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1"}

    async def run() -> tuple[list[dict[str, Any]], ...]:
        async with websockets.connect(ws_url(server), additional_headers={
                "OpenAI-Beta": "responses_websockets=2026-02-06"}) as socket:
            await socket.send(json.dumps({**codex, "input": [developer], "generate": False}))
            warm = await until_done(socket)
            warm_id = warm[-1]["response"]["id"]
            await socket.send(json.dumps({**codex, "input": [user], "previous_response_id": warm_id}))
            real = await until_done(socket)
            await socket.send(json.dumps({"type": "response.processed", "response_id": real[-1]["response"]["id"]}))
            nested = {"type": "response.create", "response": {
                "model": MODEL, "store": False, "previous_response_id": real[-1]["response"]["id"],
                "input": [{"role": "user", "content": "Thanks."}]}}
            await socket.send(json.dumps(nested))
            return warm, real, await until_done(socket)

    warm, real, nested = asyncio.run(run())
    assert [event["type"] for event in warm] == ["response.created", "response.in_progress", "response.completed"]
    assert warm[-1]["response"]["output"] == []
    assert real[-1]["type"] == "response.completed"
    assert real[-1]["response"]["output"][-1]["content"][0]["text"] == "It is 18C."
    assert nested[-1]["type"] == "response.completed"
    assert len(engine.requests) == 2  # the pre-warm generated nothing
    http_engine = Recording(scripted_engine(vocab, [ANSWER]))
    http_server = serve(engine=http_engine, store_path=None)
    http_events(http_server, {k: v for k, v in codex.items() if k not in ("type", "stream")}
                | {"input": [developer, user]})
    assert engine.requests[0].prompt_token_ids == http_engine.requests[0].prompt_token_ids


def test_errors_are_error_events_and_the_connection_goes_on(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=scripted_engine(vocab, [ANSWER]))

    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(ws_url(server)) as socket:
            errors = []
            for message in ("{not json", json.dumps({"type": "response.teleport"}),
                            json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                        "previous_response_id": "resp_missing"}),
                            json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "temperature": 9}),
                            json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                        "background": True}),
                            json.dumps({"type": "response.create", "model": "gpt-9", "input": "hi",
                                        "stream_id": "lane-a"})):
                await socket.send(message)
                errors += await until_done(socket)
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
            return errors + await until_done(socket)

    events = asyncio.run(run())
    assert [(e["type"], e.get("status"), e.get("error", {}).get("code")) for e in events[:6]] == [
        ("error", 400, "invalid_json"), ("error", 400, "invalid_event"),
        ("error", 404, "previous_response_not_found"), ("error", 400, "decimal_above_max_value"),
        ("error", 400, "unsupported_parameter"), ("error", 404, "model_not_found")]
    assert events[3]["error"]["param"] == "temperature" and events[3]["error"]["type"] == "invalid_request_error"
    assert events[5]["stream_id"] == "lane-a"
    assert events[-1]["type"] == "response.completed"


def test_lanes_run_side_by_side_and_a_cancel_stops_one(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """Two lanes stream at once; each event names its lane; `response.cancel` ends one with
    `response.cancelled` and cancels its engine request, and the other lane finishes."""
    long = "<|channel|>final<|message|>" + "word " * 400 + "<|return|>"
    engine = Recording(scripted_engine(vocab, [long, long], token_delay=0.002))
    server = serve(engine=engine)

    async def run() -> dict[str, list[dict[str, Any]]]:
        async with websockets.connect(ws_url(server)) as socket:
            for lane in ("a", "b"):
                await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                                              "stream_id": lane}))
            events: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
            cancelled = False
            while not all(events[lane] and events[lane][-1]["type"] in TERMINAL for lane in events):
                event = json.loads(await socket.recv())
                events[event["stream_id"]].append(event)
                if not cancelled and event["stream_id"] == "a" and event["type"] == "response.output_text.delta":
                    await socket.send(json.dumps({"type": "response.cancel",
                                                  "response_id": events["a"][0]["response"]["id"]}))
                    cancelled = True
            return events

    events = asyncio.run(run())
    assert events["a"][-1]["type"] == "response.cancelled"
    assert events["a"][-1]["response"]["status"] == "cancelled"
    assert events["b"][-1]["type"] == "response.completed"
    first_b = next(i for i, e in enumerate(events["b"]) if e["type"] == "response.output_text.delta")
    assert engine.cancelled.wait(5)
    assert len(events["a"]) > 3 and first_b < len(events["b"]) - 1
    stored = httpx.get(f"{server.base_url}/v1/responses/{events['a'][0]['response']['id']}").json()
    assert stored["status"] == "cancelled"


def test_one_lane_runs_in_order_and_limits_hold(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = scripted_engine(vocab, [ANSWER] * 40, token_delay=0.01)
    server = serve(engine=engine)

    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(ws_url(server)) as socket:
            for _ in range(17):
                await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
            events = []
            while sum(e["type"] in TERMINAL for e in events) < 17:
                events.append(json.loads(await socket.recv()))
            return events

    events = asyncio.run(run())
    refused = [e for e in events if e["type"] == "error"]
    assert [e["error"]["code"] for e in refused] == ["too_many_active_responses"] and refused[0]["status"] == 429
    ids = [e["response"]["id"] for e in events if e["type"] == "response.created"]
    done = [e["response"]["id"] for e in events if e["type"] == "response.completed"]
    assert len(ids) == 16 and ids == done  # one lane: FIFO, one after another
    starts = [i for i, e in enumerate(events) if e["type"] == "response.created"]
    ends = [i for i, e in enumerate(events) if e["type"] == "response.completed"]
    assert all(end < start for end, start in zip(ends, starts[1:], strict=False))


def test_stored_before_terminal_and_disconnect_cancels(serve: Callable[..., LiveServer], vocab: Any) -> None:
    long = "<|channel|>final<|message|>" + "word " * 2000 + "<|return|>"
    engine = Recording(scripted_engine(vocab, [ANSWER, long], token_delay=0.002))
    server = serve(engine=engine)

    async def run() -> str:
        async with websockets.connect(ws_url(server)) as socket:
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
            done = await until_done(socket)
            async with httpx.AsyncClient() as http:  # saved before the terminal event was sent
                reply = await http.get(f"{server.base_url}/v1/responses/{done[-1]['response']['id']}")
            assert reply.status_code == 200 and reply.json()["status"] == "completed"
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
            while json.loads(await socket.recv())["type"] != "response.output_text.delta":
                pass
            return "left"

    assert asyncio.run(run()) == "left"
    assert engine.cancelled.wait(5)  # leaving cancelled the engine request
    metrics = httpx.get(server.base_url + "/metrics").text
    assert 'method="WS"' in metrics


def test_connection_lifetime_ends_cleanly(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=scripted_engine(vocab, [ANSWER]), ws_lifetime=0.3)

    async def run() -> tuple[dict[str, Any], int | None]:
        async with websockets.connect(ws_url(server)) as socket:
            event = json.loads(await socket.recv())
            with pytest.raises(websockets.ConnectionClosedOK):
                await socket.recv()
            return event, socket.close_code

    event, code = asyncio.run(run())
    assert event["type"] == "error" and event["error"]["code"] == "websocket_connection_limit_reached"
    assert code == 1000


def test_auth_by_header_or_subprotocol(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(engine=scripted_engine(vocab, [ANSWER, ANSWER]), api_key="sekrit")
    create = json.dumps({"type": "response.create", "model": MODEL, "input": "hi"})

    async def run() -> tuple[int, str | None, list[str]]:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(ws_url(server)):
                pass
        finals = []
        async with websockets.connect(ws_url(server), additional_headers={"Authorization": "Bearer sekrit"}) as s:
            await s.send(create)
            finals.append((await until_done(s))[-1]["type"])
        async with websockets.connect(ws_url(server), subprotocols=[  # type: ignore[list-item]
                "openai-insecure-api-key.sekrit", "openai-beta.responses-v1"]) as s:
            await s.send(create)
            finals.append((await until_done(s))[-1]["type"])
            chosen = s.subprotocol
        return refused.value.response.status_code, chosen, finals

    status, chosen, finals = asyncio.run(run())
    assert status == 401
    assert chosen == "openai-beta.responses-v1"  # the key is not echoed back
    assert finals == ["response.completed", "response.completed"]


def test_agents_sdk_over_its_websocket_transport(serve: Callable[..., LiveServer], vocab: Any) -> None:
    from agents import Agent, function_tool, responses_websocket_session, set_tracing_disabled

    set_tracing_disabled(True)
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"sunny, 18 degrees in {city}"

    async def run() -> Any:
        async with responses_websocket_session(
                api_key="unused", base_url=server.base_url + "/v1", openai_prefix_mode="model_id",
                unknown_prefix_mode="model_id") as session:
            agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                          model=MODEL)
            result = session.run_streamed(agent, "What is the weather in Paris?")
            async for _ in result.stream_events():
                pass
            return result

    result = asyncio.run(run())
    assert calls == ["Paris"]
    assert result.final_output == "It is 18C."
    assert len(engine.requests) == 2
    second = vocab.decode(engine.requests[1].prompt_token_ids)
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 18 degrees" in second


def test_pings_keep_a_live_client_and_close_a_dead_one(vocab: Any) -> None:
    """uvicorn pings (--ws-ping-interval, --ws-ping-timeout): a client that answers stays connected while idle;
    a peer that never answers (a raw socket after the handshake) is closed."""
    from proxy.app import create_app
    from proxy.config import ServerConfig
    from proxy.state import ServerState

    engine = scripted_engine(vocab, [ANSWER])
    server = LiveServer(create_app(ServerState(ServerConfig(), vocab, engine)), engine, ws_ping_interval=0.2,
                        ws_ping_timeout=0.3).start()
    try:
        async def live() -> str:
            async with websockets.connect(ws_url(server)) as socket:
                await asyncio.sleep(1.5)  # several pings, answered by the client library
                await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
                return (await until_done(socket))[-1]["type"]

        assert asyncio.run(live()) == "response.completed"
        dead = socket_module.create_connection(("127.0.0.1", server.port), timeout=120)
        dead.sendall(b"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        received = b""
        while chunk := dead.recv(4096):  # the 101, pings, then the close: the server ends the connection
            received += chunk
        assert received.startswith(b"HTTP/1.1 101")  # and closed: recv returned b"" (pytest-timeout: a hang)
        dead.close()
    finally:
        server.stop()


def test_a_codex_session_extends_every_prompt_token_for_token(serve: Callable[..., LiveServer], vocab: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A Codex-shaped session over one connection, `store: false`, sealed reasoning, a function call, a custom
    tool call (apply_patch), a final answer, then a new user message: every turn after the pre-warm extends the
    last prompt, and every prompt is, token for token, the one HTTP renders for the whole conversation."""
    from proxy.responses import turns
    from tests.test_codex_dialect import APPLY_PATCH, PATCH_CALL

    extended: list[bool] = []
    plan = turns.plan

    async def recording_plan(*args: Any, **kwargs: Any) -> Any:
        made = await plan(*args, **kwargs)
        extended.append(made.extended)
        return made

    monkeypatch.setattr(turns, "plan", recording_plan)
    script = [CALL, PATCH_CALL, ANSWER, ANSWER]
    engine = Recording(scripted_engine(vocab, script))
    server = serve(engine=engine, reasoning_key="a shared key of this test")
    codex = {"type": "response.create", "model": MODEL, "instructions": "", "tools": [*TOOLS, APPLY_PATCH],
             "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
             "stream": True, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
             "client_metadata": {"session_id": "s-1"}}
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather, then a file."}]}

    async def run() -> list[list[Any]]:
        conversation: list[Any] = [developer, user]
        sent: list[list[Any]] = []  # each turn's whole conversation, as a stateless client would send it
        async with websockets.connect(ws_url(server)) as socket:
            await socket.send(json.dumps({**codex, "input": conversation, "generate": False}))
            previous = (await until_done(socket))[-1]["response"]
            new: list[Any] = []
            for _ in range(4):
                sent.append(conversation + new)
                await socket.send(json.dumps({**codex, "input": new, "previous_response_id": previous["id"]}))
                previous = (await until_done(socket))[-1]["response"]
                assert previous["status"] == "completed", previous
                conversation = conversation + new + previous["output"]
                last = previous["output"][-1]
                if last["type"] == "function_call":
                    new = [{"type": "function_call_output", "call_id": last["call_id"], "output": "sunny"}]
                elif last["type"] == "custom_tool_call":
                    new = [{"type": "custom_tool_call_output", "call_id": last["call_id"], "output": "Done!"}]
                else:
                    new = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "More?"}]}]
        return sent

    conversations = asyncio.run(run())
    assert extended == [False, True, True, True, True]  # the pre-warm rendered in full; every turn after extended
    assert [c[-1]["type"] for c in conversations] == ["message", "function_call_output", "custom_tool_call_output",
                                                      "message"]
    assert any(item.get("encrypted_content") for item in conversations[-1] if item["type"] == "reasoning")
    http_engine = Recording(scripted_engine(vocab, [ANSWER]))
    http_server = serve(engine=http_engine, store_path=None, reasoning_key="a shared key of this test")
    body = {k: v for k, v in codex.items() if k not in ("type", "stream")}
    for step, conversation in enumerate(conversations):
        http_events(http_server, body | {"input": conversation})
        assert engine.requests[step].prompt_token_ids == http_engine.requests[step].prompt_token_ids, step


def test_admission_refuses_over_websocket_as_over_http(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """One slot, no queue: a second response while the first generates is an `error` event, status 429, with
    Retry-After, before any response event; the connection goes on."""
    from proxy.admission import AdmissionQueue, AdmittedEngine

    long = "<|channel|>final<|message|>" + "word " * 400 + "<|return|>"
    server = serve(engine=AdmittedEngine(scripted_engine(vocab, [long], token_delay=0.002), AdmissionQueue(1, 0)))

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with websockets.connect(ws_url(server)) as socket:
            lanes: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "stream_id": "a"}))
            lanes["a"].append(json.loads(await socket.recv()))  # a holds the slot
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "stream_id": "b"}))
            while not all(events and events[-1]["type"] in TERMINAL for events in lanes.values()):
                event = json.loads(await socket.recv())
                lanes[event["stream_id"]].append(event)
            return lanes["a"], lanes["b"]

    first, second = asyncio.run(run())
    assert first[-1]["type"] == "response.completed"
    assert [event["type"] for event in second] == ["error"]
    assert second[0]["status"] == 429 and second[0]["error"]["code"] == "server_overloaded"
    assert second[0]["headers"] == {"Retry-After": "1"}


def test_a_connection_keeps_a_bounded_number_of_turns(vocab: Any) -> None:
    from proxy.responses.turns import Plan, TurnMemory, Turns

    kept = Turns(None, TurnMemory(), max_turns=2)  # type: ignore[arg-type]  # nothing to unseal
    for number in range(3):
        kept.remember(f"resp_{number}", Plan([], [{"type": "message", "role": "user", "content": []}], None, {}, None),
                      [])
    assert kept.get("resp_0") is None and kept.get("resp_1") is not None and kept.get("resp_2") is not None


def test_context_management_compacts_over_websocket(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """`context_management` on a continued turn: the server compacts (the continuation's prompt is set aside),
    the compaction item leads the output, and the next turn on the connection renders from it."""
    from tests.test_compaction import SUMMARIZED, SUMMARY

    engine = Recording(scripted_engine(vocab, [CALL, ANSWER, SUMMARIZED, ANSWER, ANSWER]))
    server = serve(engine=engine)
    base = {"type": "response.create", "model": MODEL, "tools": TOOLS, "store": False}

    async def run() -> list[dict[str, Any]]:
        finals = []
        async with websockets.connect(ws_url(server)) as socket:
            await socket.send(json.dumps({**base, "input": "Weather in Paris?"}))
            finals.append((await until_done(socket))[-1]["response"])
            call = finals[-1]["output"][-1]
            for new, extra in (([{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}], {}),
                               ([{"role": "user", "content": "And tomorrow?"}],
                                {"context_management": [{"type": "compaction", "compact_threshold": 1}]}),
                               ([{"role": "user", "content": "Thanks"}], {})):
                await socket.send(json.dumps({**base, **extra, "input": new,
                                              "previous_response_id": finals[-1]["id"]}))
                finals.append((await until_done(socket))[-1]["response"])
        return finals

    finals = asyncio.run(run())
    assert [item["type"] for item in finals[2]["output"]] == ["compaction", "reasoning", "message"]
    assert finals[3]["status"] == "completed"
    last_prompt = vocab.decode(engine.requests[4].prompt_token_ids)
    assert SUMMARY in last_prompt and "sunny<|end|>" not in last_prompt
