"""One record per request, filled along the request path and read once when the request ends.

The HTTP observer (`proxy/telemetry/observer.py`) opens it and puts it in a context variable; the layers below fill in
what they alone know: the admission queue its wait (`proxy/admission.py`), the generation its outcome, token
timing, tool calls and engine errors (`proxy/generation.py`). When the request ends, the metrics and the access
log both read the same record, so no fact is measured twice. Code that runs outside any request (tests driving
an engine directly) finds no record and records nothing.

The token path is hot: per engine step the generation reads the clock and counts the gap since the last step
in its bucket (ITL_BUCKETS); the counts go to the histogram once, at the end.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.engines.base import EngineError
    from proxy.outcome import Outcome

# vLLM's buckets for vllm:inter_token_latency_seconds (vllm/v1/metrics/loggers.py): the generation counts gaps
# into them on the token path, the metrics add the counts up.
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
MAX_REQUEST_ID = 128
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,%d}" % MAX_REQUEST_ID)  # safe in a header and in a log line


class Trace(Protocol):
    """What the request path asks of a request's spans; `proxy/telemetry/tracing.py`'s RequestTrace (which reads this
    record, so this module does not import it)."""

    def record_stage(self, name: str, started: float, ended: float) -> None: ...
    def detached(self, name: str) -> Trace: ...
    def engine_ended(self, outcome: Outcome, first_token_at: float | None, error: str | None) -> None: ...
    def finish(self, record: RequestRecord) -> None: ...


@dataclass(eq=False)
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    route: str = "unmatched"  # the route's path template (bounded label values), set once routed
    api: str = "none"
    status: int = 0  # 0 until the response starts
    streamed: bool = False
    client_left: bool = False  # the client went away before its answer was complete
    background: bool = False  # a background response's generation, after its POST was answered
    # generation, when the request ran one
    outcome: Outcome | None = None
    response_id: str | None = None  # the engine request's id (chatcmpl-..., resp_..., cmpl-...)
    generation_ended: bool = False
    admitted_at: float | None = None
    queued_seconds: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    gap_counts: list[int] | None = None  # inter-token gaps per ITL_BUCKETS bucket (+Inf last)
    gap_sum: float = 0.0
    tool_calls: int = 0
    engine_error: str | None = None  # an EngineError's code, when the engine refused or failed the request
    ended: float | None = None
    publish: Callable[[RequestRecord], None] | None = None  # where the finished record goes (metrics, log)
    trace: Trace | None = None  # the request's spans, when tracing is on (proxy/telemetry/tracing.py)

    def token_times(self, first: float | None, last: float | None, gaps: list[int]) -> None:
        """When the first and last engine steps with tokens came, and the gaps between steps, bucketed."""
        self.first_token_at, self.last_token_at = first, last
        if first is not None and last is not None and last > first:
            self.gap_counts, self.gap_sum = gaps, last - first  # the gaps add up to the time from first to last

    def engine_failed(self, error: EngineError) -> None:
        if error.status != 429:  # a full admission queue refuses requests; the engine did not fail
            self.engine_error = error.code or f"http_{error.status}"

    @property
    def error_kind(self) -> str | None:
        """Why the engine failed the request: its error's code, or how it ended the request itself."""
        if self.engine_error is not None:
            return self.engine_error
        reason = self.outcome.finish_reason if self.outcome is not None else None
        return {"error": "engine_error", "cancelled": "engine_cancelled"}.get(reason or "")

    @property
    def finish_reason(self) -> str | None:
        """How the generation ended, in OpenAI's words where they apply; None when none ran."""
        if self.outcome is None or self.admitted_at is None:
            return None
        reason = self.outcome.finish_reason
        if reason is None:  # the engine failed, or the consumer stopped reading: a client left, or a stop string
            if self.engine_error is not None:
                return "error"
            return "abort" if self.client_left else "stop"
        if reason == "stop" and self.tool_calls:
            return "tool_calls"
        return reason

    def answered(self) -> bool:
        """Whether a client that leaves now has its answer: its generation ended, or a response without one
        started. A disconnect that comes after that is the connection closing, not a client leaving early."""
        return self.generation_ended or (self.outcome is None and self.status != 0)

    def finish(self) -> None:
        self.ended = time.perf_counter()
        if self.publish is not None:
            self.publish(self)


current_record: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("request_record", default=None)


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's `x-request-id` when it is short and plain (it is echoed and logged), else a new one."""
    for name, value in headers:
        if name == b"x-request-id":
            if _CLIENT_ID.fullmatch(value):
                return value.decode()
            break
    return os.urandom(16).hex()  # as random as uuid4().hex, at a fifth of its cost


def note_admitted(waited: float) -> None:
    """The current request got its admission slot after waiting `waited` seconds."""
    record = current_record.get()
    if record is not None:
        record.queued_seconds = waited
        record.admitted_at = time.perf_counter()
        if record.trace is not None:
            record.trace.record_stage("queue", record.admitted_at - waited, record.admitted_at)


def run_detached(work: Coroutine[Any, Any, None], name: str, route: str, api: str) -> asyncio.Task[None]:
    """Run work that outlives its request (a background response) with a record of its own, published when the
    work ends, so its generation is measured and logged although the request that started it was answered."""
    parent = current_record.get()
    context = contextvars.copy_context()
    if parent is None:
        return asyncio.create_task(work, name=name, context=context)
    child = RequestRecord(parent.request_id, parent.method, parent.path, route=route, api=api, status=200,
                          background=True, publish=parent.publish,
                          trace=parent.trace.detached("background") if parent.trace is not None else None)

    async def detached() -> None:
        try:
            await work
        finally:
            child.finish()

    context.run(current_record.set, child)
    return asyncio.create_task(detached(), name=name, context=context)
