"""The Responses API over WebSocket: `GET /v1/responses` upgraded, `response.create` messages in, the events
of `POST /v1/responses` streamed out (one text message each, with the same `sequence_number`s), turn after turn.

A create is parsed, checked, run and stored by the same code as over HTTP (proxy/responses/transport/routes.py); what is
the connection's own: its turns (proxy/responses/turns.py: `previous_response_id` with `store: false`, and a
prompt that extends the last turn's tokens), its lanes (`stream_id`: creates of one lane run one after another,
lanes side by side; no `stream_id` is a lane too), and OpenAI's limits: 16 responses active or queued, 32 named
lanes, 60 minutes (then `websocket_connection_limit_reached` and a normal close, once nothing runs).

Each create gets its own request record (request id `<connection id>.<n>`, metrics, access log line, method
`WS`). A failure before a response starts is an `error` event in OpenAI's shape, with `status`; after it, the
response fails as over SSE. `response.cancel` (`response_id`) stops a response, which ends with
`response.cancelled`; the client leaving cancels every response of the connection. `response.steer` stops a
running response and continues it with the client's input (proxy/responses/steering.py). Pings are uvicorn's
(`--ws-ping-interval`, `--ws-ping-timeout`): a peer that stops answering them is closed.

Hostile clients: every message is checked before it is read (ws_messages.py), and whatever else goes wrong in
handling one is an `error` event, never the end of the connection (only the protocol's close codes end it: 1007
for a binary frame that is not UTF-8). A connection handles messages for TURN_SECONDS at most before it yields to
the event loop, so one flooding small messages takes its turn with every other request (and the server parses what
it reads a slice at a time: proxy/server/sliced_websocket.py). A continuation
(`previous_response_id`) that fails evicts the turn it continued, as the Open Responses spec has: continuing from
it again is `previous_response_not_found`.
A connection with no message being handled and no response running tells the server's connection guard it is
idle: at `--max-connections` it may be shed for a new client (proxy/server/connections.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from functools import partial
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from proxy.auth import KEY_SUBPROTOCOL
from proxy.engines.base import EngineError
from proxy.errors import APIError, from_engine, invalid_request
from proxy.responses import turns
from proxy.responses.request.parse import offer_earlier_tools, parse_responses_request, resolve
from proxy.responses.run import ResponseRun
from proxy.responses.steering import Steer
from proxy.responses.transport.frames import EventWriter
from proxy.responses.transport.routes import check_create, new_run, prewarm_run
from proxy.responses.transport.steers import ConnectionSteering, Successor
from proxy.responses.transport.ws_messages import INVALID_UTF8, NotText, frame_text, read_message
from proxy.schema_errors import quote
from proxy.state import ServerState
from proxy.telemetry.observer import publish
from proxy.telemetry.request_record import RequestRecord, current_record, request_id_from
from proxy.telemetry.tracing import RequestTrace
from proxy.validation import LARGE_BODY_BYTES, parse_off_loop

logger = logging.getLogger("harmony_proxy")

MAX_ACTIVE = 16
MAX_LANES = 32
LIFETIME_SECONDS = 3600.0
TURN_SECONDS = 0.002  # of messages handled back to back before the connection lets other tasks run
ROUTE = "/v1/responses"
# The ASGI scope extension through which a connection says whether it is idle: `{"idle": callable(bool)}`,
# given by the server's connection guard (proxy/server/connections.py) where it runs.
IDLE_EXTENSION = "harmony.idle"


async def responses_socket(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.harmony
    await ResponsesConnection(websocket, state, state.config.ws_lifetime).serve()


class ResponsesConnection:
    def __init__(self, websocket: WebSocket, state: ServerState, lifetime: float = LIFETIME_SECONDS) -> None:
        self._socket = websocket
        self._state = state
        self._lifetime = lifetime
        self._id = request_id_from(websocket.scope["headers"])
        self._turns = turns.Turns(state.unsealer, state.turn_memory)
        self._tasks: set[asyncio.Task[None]] = set()  # responses active or waiting in their lane
        self._lanes: dict[str | None, asyncio.Task[None]] = {}  # each lane's last response
        self._by_id: dict[str, asyncio.Task[None]] = {}
        self._cancelled: set[asyncio.Task[None]] = set()  # cancelled by `response.cancel`, not by a departure
        self._steering = ConnectionSteering(self._send_quietly, lambda response_id: self._turns.get(response_id)
                                            is not None)
        self._count = 0
        self._expired = False
        self._closed = False
        self._turn_began = time.perf_counter()
        extension = (websocket.scope.get("extensions") or {}).get(IDLE_EXTENSION) or {}
        self._idle = extension.get("idle") or (lambda idle: None)  # sheddable at the cap when idle
        self._handling = False  # a message is being handled

    async def serve(self) -> None:
        await self._socket.accept(subprotocol=_subprotocol(self._socket.scope.get("subprotocols") or []),
                                  headers=[(b"x-request-id", self._id.encode())])
        timer = asyncio.get_running_loop().call_later(self._lifetime, self._expire)
        try:
            while True:
                self._handling = False
                self._report_idle()
                message = await self._socket.receive()
                self._handling = True
                self._report_idle()
                if message["type"] == "websocket.disconnect":
                    break
                try:
                    text = frame_text(message)
                except NotText:
                    await self._socket.close(INVALID_UTF8, "a binary frame that is not UTF-8")
                    break
                await self._handle_safely(text)
                await self._take_turns()
        except WebSocketDisconnect:
            pass
        finally:
            timer.cancel()
            self._closed = True
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            self._turns.close()  # their bytes go back to the server's budget

    async def _take_turns(self) -> None:
        """Messages already received are handled without a pause of their own: past TURN_SECONDS of them, let every
        other ready task run (a flood of small messages waits its turn; a normal client never reaches it)."""
        now = time.perf_counter()
        if now - self._turn_began > TURN_SECONDS:
            await asyncio.sleep(0)
            self._turn_began = time.perf_counter()

    async def _handle_safely(self, text: str) -> None:
        """One message handled; what goes wrong is an `error` event: nothing a client sends ends the connection."""
        try:
            await self._handle(text)
        except APIError as exc:
            await self._error(exc)
        except Exception:
            logger.exception("websocket connection %s: a message failed", self._id)
            await self._error(APIError(500, "The server had an error while processing your message.",
                                       type="server_error"))

    async def _handle(self, text: str) -> None:
        kind, data = await read_message(text)
        if kind == "response.create":
            await self._create(data, large=len(text) >= LARGE_BODY_BYTES)
        elif kind == "response.cancel":
            await self._cancel(data["response_id"])
        elif kind == "response.steer":
            await self._steering.steer(data)
        # response.processed: Codex acknowledges each response it has handled; nothing waits for it here

    async def _create(self, data: dict[str, Any], large: bool) -> None:
        nested = data.get("response")
        body = dict(nested) if isinstance(nested, dict) else {k: v for k, v in data.items() if k != "type"}
        stream_id = body.pop("stream_id", data.get("stream_id"))
        generate = body.pop("generate", data.get("generate", True))
        body.pop("stream", None)  # every response is streamed here
        lane_error = _check_envelope(stream_id, generate, body)
        if lane_error is None and self._expired:
            lane_error = _limit_reached()
        if lane_error is None and len(self._tasks) >= MAX_ACTIVE:
            lane_error = APIError(429, f"This connection has {MAX_ACTIVE} responses active or queued; wait for one "
                                  "to finish.", code="too_many_active_responses")
        if lane_error is None and stream_id is not None and stream_id not in self._lanes \
                and sum(lane is not None for lane in self._lanes) >= MAX_LANES:
            lane_error = invalid_request(f"This connection has {MAX_LANES} streams with responses; use one of them "
                                         "or wait.", param="stream_id", code="too_many_streams")
        if lane_error is not None:
            await self._error(lane_error, stream_id if isinstance(stream_id, str) else None)
            return
        self._count += 1
        before = self._lanes.get(stream_id)
        task = asyncio.create_task(self._respond(body, stream_id, generate, before, f"{self._id}.{self._count}",
                                                 large))
        self._tasks.add(task)
        self._lanes[stream_id] = task
        task.add_done_callback(partial(self._done, stream_id))

    def _done(self, stream_id: str | None, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._cancelled.discard(task)
        self._report_idle()
        if self._lanes.get(stream_id) is task:
            del self._lanes[stream_id]
        if self._expired and not self._tasks and not self._closed:
            asyncio.get_running_loop().create_task(self._close_expired())

    def _report_idle(self) -> None:
        self._idle(not self._tasks and not self._handling and not self._closed)

    async def _cancel(self, response_id: str) -> None:
        task = self._by_id.get(response_id)
        if task is None or task.done():
            await self._error(APIError(404, f"No response {quote(response_id)} is running on this connection.",
                                       param="response_id", code="response_not_found"))
            return
        self._cancelled.add(task)
        task.cancel()

    async def _respond(self, body: dict[str, Any], stream_id: str | None, generate: bool,
                       before: asyncio.Task[None] | None, request_id: str, large: bool) -> None:
        successor = await self._respond_one(body, [], stream_id, generate, before, request_id, large)
        while successor is not None:  # a steered response is followed by its successor, on this lane
            self._count += 1
            successor = await self._respond_one(*successor, stream_id, True, None, f"{self._id}.{self._count}", False)

    async def _respond_one(self, body: dict[str, Any], committing: list[Steer], stream_id: str | None,
                           generate: bool, before: asyncio.Task[None] | None, request_id: str,
                           large: bool) -> Successor | None:
        """One response; when steered, its successor's create and the steers that create commits."""
        state = self._state
        record = RequestRecord(request_id, "WS", ROUTE, route=ROUTE, api="responses", streamed=True,
                               publish=partial(publish, state.metrics, state.config.served_model_name))
        if state.tracer is not None:  # each response is a request span, the handshake's traceparent its parent
            record.trace = RequestTrace.of_request(state.tracer, "WS", self._socket.scope["headers"])
        current_record.set(record)  # this task's own context
        state.metrics.stream_opened("responses")
        run: ResponseRun | None = None
        writer = EventWriter()
        try:
            if before is not None:
                await asyncio.wait([before])  # the lane's responses run in order; how that one ended is its own
            if not committing:  # steers held for the tool output this create brings go first in its input
                body = self._steering.held_input(body)
            config = state.config
            parse = partial(parse_responses_request, body, config.default_reasoning_effort,
                            config.served_model_name, state.renderer.tools)
            parsed = await parse_off_loop(parse, large)  # as over HTTP
            await check_create(state, parsed)
            generate = generate and not parsed.prewarm
            previous = self._turns.get(parsed.body.get("previous_response_id"))
            history, items = await resolve(parsed, state.responses, previous.items if previous else None)
            offer_earlier_tools(parsed, history, items, state.renderer.tools)
            plan = await turns.plan(state.renderer, state.unsealer(), parsed, previous, history, items, generate)
            prompt = plan.rendered.tokens if plan.rendered is not None else None
            if generate:
                run = await new_run(state, parsed, history, items, self._socket.headers, prompt=prompt)
            else:
                run = await prewarm_run(state, parsed, history, items, prompt)
            self._by_id[run.id] = asyncio.current_task()  # type: ignore[assignment]
            await run.start()
            record.status = 200
            running = self._steering.started(run, body, writer, stream_id)
            async for batch in run.batches():  # a stored run saves itself before its terminal event
                async with running.sending:
                    for message in writer.messages(batch, stream_id):
                        await self._socket.send_text(message)
            resource = run.resource()
            if resource["status"] in ("completed", "incomplete"):
                self._turns.remember(run.id, plan, resource["output"])
            elif resource["status"] == "failed":
                self._turns.forget(body.get("previous_response_id"))
            return await self._steering.finished(running, resource)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task not in self._cancelled or task is None:
                record.client_left = self._closed and not record.answered()
                raise
            task.uncancel()  # cancelled by the client's `response.cancel`: say so, and go on serving
            await self._cancelled_run(run, writer, stream_id, record)
        except (APIError, EngineError) as exc:
            error = from_engine(exc) if isinstance(exc, EngineError) else exc
            if record.status == 0:
                record.status = error.status
            self._turns.forget(body.get("previous_response_id"))
            await self._error(error, stream_id)
            if run is None or not run.finished:  # the steers' successor was never created
                await self._steering.fail(committing, "successor_creation_failed", error.message, stream_id)
        except (OSError, WebSocketDisconnect):  # a send to a client that has left
            record.client_left = not record.answered()
            if record.status == 0:
                record.status = 499
        except Exception:
            logger.exception("websocket response %s failed", request_id)
            self._turns.forget(body.get("previous_response_id"))
            if record.status == 0:
                record.status = 500
            await self._error(APIError(500, "The server had an error while processing your request.",
                                       type="server_error"), stream_id)
        finally:
            if run is not None:
                self._by_id.pop(run.id, None)
                if not self._closed:
                    await self._steering.stopped(run.id, stream_id)
            state.metrics.stream_closed("responses")
            record.finish()
        return None

    async def _cancelled_run(self, run: ResponseRun | None, writer: EventWriter, stream_id: str | None,
                             record: RequestRecord) -> None:
        if record.status == 0:
            record.status = 499
        if run is None:
            return
        run.cancel()
        if run.request.store and self._state.responses is not None:
            await self._state.responses.save(run.record())
        for message in writer.messages([{"type": "response.cancelled", "response": run.resource()}], stream_id):
            await self._send_quietly(message)

    async def _error(self, error: APIError, stream_id: str | None = None) -> None:
        event: dict[str, Any] = {"type": "error", "status": error.status, "error": error.body()["error"]}
        if error.headers:
            event["headers"] = event["error"]["headers"] = error.headers
        if stream_id is not None:
            event["stream_id"] = stream_id
        await self._send_quietly(json.dumps(event, ensure_ascii=False))

    async def _send_quietly(self, message: str) -> None:
        """A message about a failure: a client that left meanwhile is no failure of ours."""
        if self._closed:
            return
        with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect):
            await self._socket.send_text(message)

    def _expire(self) -> None:
        """OpenAI's connections last 60 minutes: new creates are refused; the socket closes once idle."""
        self._expired = True
        if not self._tasks:
            asyncio.get_running_loop().create_task(self._close_expired())

    async def _close_expired(self) -> None:
        if self._closed:
            return
        await self._error(_limit_reached())
        self._closed = True
        with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect):
            await self._socket.close(1000, "connection lifetime reached")


def _check_envelope(stream_id: Any, generate: Any, body: dict[str, Any]) -> APIError | None:
    if stream_id is not None and (not isinstance(stream_id, str) or not 1 <= len(stream_id) <= 256):
        return invalid_request("`stream_id` must be a string of 1 to 256 characters.", param="stream_id")
    if not isinstance(generate, bool):
        return invalid_request("`generate` must be a boolean.", param="generate")
    if body.get("background"):
        return invalid_request("Background responses are not supported over WebSocket: use POST /v1/responses.",
                               param="background", code="unsupported_parameter")
    return None


def _limit_reached() -> APIError:
    return APIError(400, f"Responses websocket connection limit reached ({int(LIFETIME_SECONDS // 60)} minutes). "
                    "Create a new websocket connection to continue.", code="websocket_connection_limit_reached")


def _subprotocol(offered: list[str]) -> str | None:
    """A browser offering subprotocols needs one echoed: any but the one that carries the key. The key alone
    offered gets none (a browser then fails the connection: offer a second one, as OpenAI's Realtime clients
    do): a secret is never written into a response header."""
    return next((name for name in offered if not name.startswith(KEY_SUBPROTOCOL)), None)
