"""One response being generated: its lifecycle events and its response object, streamed or not.

`ResponseRun.batches()` yields the streaming events of each engine step, `response.created` first and the
terminal event (`response.completed`, `.incomplete` or `.failed`) last; text deltas are `(item, text)` tuples
for `proxy/responses/transport/frames.py` to write. A non-streamed or background response consumes the same events
through `events()`, which leaves the deltas out (the items hold their text), so all three give the same
response object.

A stored run saves its finished record *before* it yields the terminal event, whichever path consumes it (plain,
streamed, background, server-side tool loop; a WebSocket transport alike): a client that has seen
`response.completed` may stop reading at once, and the response it was told about must then be there to GET or
to continue. The save is shielded: the consumer's cancellation cannot undo it once it began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from parsers.events import Event
from proxy.disconnect import close_shielded
from proxy.engines.base import EngineError
from proxy.outcome import Outcome
from proxy.responses.output.fold import Payload, ResponseOutput, TextDelta
from proxy.responses.output.resource import response_object
from proxy.responses.output.server_output import ToolEvent
from proxy.responses.request.parse import ResponsesRequest
from proxy.responses.transport.frames import EventWriter
from proxy.store.base import StoredResponse, StoreUnavailable

# The parser's events of each engine step; with server-side tools, also the tool loop's (proxy/responses/tool_loop.py).
logger = logging.getLogger("harmony_proxy")
RunEvents = AsyncGenerator[list[Event | ToolEvent], None]
Save = Callable[[StoredResponse], Awaitable[object]]  # a store's `save`, or a job's `BackgroundJobs.save_end`
_TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


class ResponseRun:
    def __init__(
        self,
        response_id: str,
        request: ResponsesRequest,
        input_items: list[dict[str, Any]],
        output: ResponseOutput,
        outcome: Outcome,
        events: RunEvents,
        save: Save | None,
    ) -> None:
        """`save` stores the finished response before its terminal event is yielded; None when not stored."""
        self.id = response_id
        self.request = request
        self.input_items = input_items
        self.created_at = int(time.time())
        self._output = output
        self._outcome = outcome
        self._events = events
        self._save = save
        self._saving: asyncio.Task[object] | None = None
        self._first: list[Event | ToolEvent] | None = None
        self._status = "queued" if request.background else "in_progress"
        self._error: dict[str, str] | None = None
        self._completed_at: int | None = None
        # A stored background response keeps its events as SSE frames until they are saved with its record
        # (`record()`, `saved()`), for `GET /v1/responses/{id}?stream=true` to replay, numbered as a stream was.
        self._journal = EventWriter() if request.background and save is not None else None
        self._unsaved: list[tuple[int, str]] = []
        self._steer = False  # a steer is queued (WebSocket, proxy/responses/steering.py): stop at the next boundary
        self.steered = False  # stopped for it: incomplete, `incomplete_details.reason: "steered"`

    async def start(self) -> None:
        """Wait for the engine's first step, so a request the engine refuses fails before anything is sent."""
        try:
            self._first = await anext(self._events)
        except BaseException:
            await close_shielded(self._events)
            raise

    async def events(self) -> AsyncGenerator[Payload, None]:
        """The events but the text deltas, one by one."""
        async for batch in self.batches():
            for payload in batch:
                if type(payload) is dict:
                    yield payload

    async def batches(self) -> AsyncGenerator[list[Payload | TextDelta], None]:
        self._status = "in_progress"
        yield self._noted([{"type": "response.created", "response": self.resource()},
                           {"type": "response.in_progress", "response": self.resource()}])
        try:
            if self._first is None:
                await self.start()
            yield self._noted(self._output.add(self._first or []))
            if not self._steered_now():
                async for batch in self._events:
                    payloads = self._output.add(batch)
                    if payloads:
                        yield self._noted(payloads)
                    if self._steered_now():
                        break
            closing: list[Payload | TextDelta] = []
            if self.steered:
                closing = list(self._output.close_open())
                self._status = "incomplete"
            else:
                self._settle(self._outcome.finish_reason)
        except EngineError as exc:
            closing = list(self._output.close_open())
            self._fail(exc.code or "server_error", exc.message)
        except asyncio.CancelledError:
            self._status = "cancelled"
            raise
        finally:
            await close_shielded(self._events)
        self._completed_at = int(time.time())
        if self._journal is not None:
            self._noted([*closing, self._terminal()])  # saved with the finished record
        await self._save_finished()
        yield [*closing, self._terminal()]

    def steer(self) -> None:
        """Stop at the next token boundary outside a tool call (the connection continues with the steer's input)."""
        self._steer = True

    def _steered_now(self) -> bool:
        self.steered = self._steer and self._outcome.finish_reason is None and not self._output.calling
        return self.steered

    def resource(self) -> dict[str, Any]:
        finished = self.finished
        return response_object(
            self.request,
            self.id,
            self.created_at,
            self._status,
            self._output.items(),
            stored=self._save is not None,
            usage=self._outcome.usage if finished else None,
            reasoning_tokens=self._outcome.reasoning_tokens,
            error=self._error,
            completed_at=self._completed_at,
            incomplete_reason="steered" if self.steered else "max_output_tokens",
        )

    def _terminal(self) -> Payload:
        return {"type": _TERMINAL.get(self._status, "response.failed"), "response": self.resource()}

    def record(self) -> StoredResponse:
        return StoredResponse(self.resource(), self.input_items, list(self._unsaved))

    def saved(self, record: StoredResponse) -> None:
        """`record` was saved: its events need not be saved again."""
        del self._unsaved[:len(record.events)]

    def _noted(self, payloads: list[Payload | TextDelta]) -> list[Payload | TextDelta]:
        if self._journal is not None:
            first = self._journal.sequence
            self._unsaved += [(first + n, frame.decode())
                              for n, frame in enumerate(self._journal.numbered_frames(payloads))]
        return payloads

    @property
    def finished(self) -> bool:
        return self._status not in ("queued", "in_progress")

    @property
    def end_saved(self) -> bool:
        """Its finished record was handed to the store (see `_save_finished`)."""
        return self._saving is not None

    async def _save_finished(self) -> None:
        """Store the finished response. In a task of its own, so that a consumer cancelled meanwhile (the client
        left) cannot interrupt it; a save that fails makes the response fail, rather than announce it stored."""
        if self._save is None:
            return
        self._saving = asyncio.ensure_future(self._save(self.record()))
        try:
            await asyncio.shield(self._saving)
        except StoreUnavailable as exc:
            logger.warning("saving response %s failed: %s", self.id, exc)
            self._fail("store_unavailable", "The response store is unavailable, so this response was not stored.")
        except Exception:
            logger.exception("saving response %s failed", self.id)
            self._fail("server_error", "The response could not be stored.")

    def cancel(self) -> None:
        self._output.close_open()
        self._status = "cancelled"
        self._completed_at = int(time.time())

    def interrupt(self, code: str, message: str) -> None:
        """Stopped by the server, not by a cancel request."""
        self._output.close_open()
        self._fail(code, message)
        self._completed_at = int(time.time())

    def _settle(self, finish_reason: str | None) -> None:
        if finish_reason == "stop":
            self._status = "completed"
        elif finish_reason == "length":
            self._status = "incomplete"  # incomplete_details.reason: max_output_tokens
        elif finish_reason == "cancelled":  # by the engine, not by a cancel request
            self._fail("engine_cancelled", "The engine cancelled the request before it finished.")
        else:
            self._fail("server_error", "The engine failed while generating.")

    def _fail(self, code: str, message: str) -> None:
        self._status = "failed"
        self._error = {"code": code, "message": message}
