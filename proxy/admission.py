"""Fair admission: at most N requests generate at once, the next M wait first come first served, the rest get 429.

Without it every request is accepted, all of them share the event loop, and under overload some clients wait
tens of seconds for a first token while others stream. With it the engine (and the loop) serve a bounded set of
streams, a queued request starts as soon as a running one ends, and a request that cannot even queue is told at
once, in OpenAI's shape with `Retry-After`, so clients back off and retry (the openai SDK does).

`AdmittedEngine` wraps any engine: a request holds its slot exactly as long as its engine stream is open, so
every API (chat, responses, raw completions, background responses) is covered in one place, and a client that
disconnects while queued leaves the queue at once (closing the stream cancels the wait).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable
from time import perf_counter

from proxy.engines.base import Engine, EngineError, EngineWrapper, GenerationRequest, Step
from proxy.telemetry.request_record import note_admitted

RETRY_AFTER_SECONDS = 1


class AdmissionQueue:
    def __init__(
        self, max_concurrent: int, max_queue: int, on_change: Callable[[int, int], None] | None = None
    ) -> None:
        """`on_change(running, waiting)` is told every change of the counts (the metrics' gauges)."""
        if max_concurrent < 1 or max_queue < 0:
            raise ValueError("max_concurrent must be at least 1 and max_queue at least 0")
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.active = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._on_change = on_change

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def enter(self) -> None:
        """Take a slot, waiting in line for one if need be; EngineError 429 when the line is full."""
        if self.active < self.max_concurrent and not self._waiting:
            self.active += 1
            self._changed()
            return
        if len(self._waiting) >= self.max_queue:
            raise self._full()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        self._changed()
        try:
            await turn  # leave() hands a finished request's slot straight to the head of the line
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave()  # the slot came to us as we were cancelled: pass it on
            else:
                self._waiting.remove(turn)
                self._changed()
            raise

    def check_room(self) -> None:
        """EngineError 429 when a request arriving now could neither run nor wait. The routes ask before they
        read and render a body, so that a burst past capacity is refused at the cost of a 429, not of a parse."""
        if self.active >= self.max_concurrent and len(self._waiting) >= self.max_queue:
            raise self._full()

    def _full(self) -> EngineError:
        return EngineError(
            f"The server is at capacity ({self.max_concurrent} requests running, {len(self._waiting)} waiting). "
            "Retry shortly.",
            status=429,
            code="server_overloaded",
            retry_after=RETRY_AFTER_SECONDS,
        )

    def leave(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                self._changed()
                return
        self.active -= 1
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.active, len(self._waiting))


class AdmittedEngine(EngineWrapper):
    """An engine whose requests go through an `AdmissionQueue` first."""

    def __init__(self, inner: Engine, queue: AdmissionQueue) -> None:
        super().__init__(inner)
        self.queue = queue

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        arrived = perf_counter()
        await self.queue.enter()
        note_admitted(perf_counter() - arrived)
        steps = self.inner.generate(request)
        try:
            async for step in steps:
                yield step
        finally:
            try:
                await steps.aclose()
            finally:
                self.queue.leave()
