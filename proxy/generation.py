"""Running one engine request: its steps, tracked (`tracked_steps`), and parsed into item events (`parsed_events`).

Both OpenAI APIs consume `parsed_events`, streaming or not, so a streamed answer and a non-streamed one come from
the same events; raw `/v1/completions` uses `tracked_steps`. Closing either iterator early closes the engine's
stream, which cancels the engine request.
"""

from __future__ import annotations

import contextlib
import logging
from bisect import bisect_left
from collections.abc import AsyncGenerator
from time import perf_counter

from parsers.events import Event, ItemKind, ItemStarted
from parsers.stream import OutputParser
from parsers.vocab import Vocab
from proxy.engines.base import Engine, EngineError, GenerationRequest, Step
from proxy.outcome import Outcome
from proxy.telemetry.request_record import ITL_BUCKETS, current_record

logger = logging.getLogger("harmony_proxy")


async def tracked_steps(engine: Engine, request: GenerationRequest, outcome: Outcome) -> AsyncGenerator[Step, None]:
    """The engine's steps, with the outcome kept current; the last step yielded carries the finish reason.

    An engine that fails with anything but EngineError is logged and reported as an EngineError, so every API
    ends its answer with a clear error rather than a broken connection or a stack trace.
    """
    record = current_record.get()  # this request's record (metrics, access log); None outside a request
    # Token timing, in locals on the hot path (a clock read and a bucket count per step), to the record at the end.
    gaps = [0] * (len(ITL_BUCKETS) + 1) if record is not None else None
    first = last = None
    if record is not None:
        record.outcome, record.response_id = outcome, request.request_id
    began = perf_counter()
    steps = engine.generate(request)
    try:
        async for step in steps:
            outcome.completion_tokens += len(step.token_ids)
            if gaps is not None and step.token_ids:
                now = perf_counter()
                if last is None:
                    first = now
                else:
                    gaps[bisect_left(ITL_BUCKETS, now - last)] += 1
                last = now
            if step.finish_reason is not None:
                outcome.finish_reason = step.finish_reason
                if step.usage is not None:
                    outcome.completion_tokens = step.usage.completion_tokens
                    outcome.cached_tokens = step.usage.cached_tokens
                yield step
                return
            yield step
        outcome.finish_reason = "stop"  # an engine that ends without saying why ended normally
        yield Step((), "stop")
    except EngineError as exc:
        if record is not None:
            record.engine_failed(exc)
        raise
    except Exception as exc:  # not GeneratorExit or CancelledError: those are the consumer closing us
        logger.exception("request %s: the %s engine failed", request.request_id, engine.name)
        failure = EngineError(f"The {engine.name} engine failed unexpectedly.", status=500, code="engine_error")
        if record is not None:
            record.engine_failed(failure)
        raise failure from exc
    finally:
        if outcome.finish_reason is None:
            logger.info("request %s: stopped after %d generated tokens", request.request_id, outcome.completion_tokens)
        if record is not None:
            record.token_times(first, last, gaps)  # type: ignore[arg-type]
            if record.admitted_at is None and (outcome.completion_tokens or outcome.finish_reason):
                record.admitted_at = began  # an engine with no admission queue in front took it at once
        try:
            await steps.aclose()
        finally:
            if record is not None:
                record.generation_ended = True
                if record.trace is not None:
                    record.trace.engine_ended(outcome, first, record.engine_error)


async def parsed_events(
    engine: Engine, request: GenerationRequest, vocab: Vocab, outcome: Outcome,
    namespaces: frozenset[str] = frozenset(), generated: list[int] | None = None,
    keep_reasoning_tokens: bool = False,
) -> AsyncGenerator[list[Event], None]:
    """Yield the events of each engine step, in order (a step may complete no event: an empty list).

    `namespaces`: server tools whose calls the parser reports; `generated`, when given, receives the token ids
    (the server-side tool loop continues the prompt with them); `keep_reasoning_tokens`: reasoning items end with
    their token ids (to seal them)."""
    parser = OutputParser(vocab, namespaces, keep_reasoning_tokens, request.constraint.tool_namespaces)
    record = current_record.get()
    try:
        async with contextlib.aclosing(tracked_steps(engine, request, outcome)) as steps:
            async for step in steps:
                if generated is not None:
                    generated += step.token_ids
                events = parser.feed(step.token_ids)
                if step.finish_reason is not None:
                    events += parser.finish()
                if record is not None and (len(events) > 1 or (events and type(events[0]) is not str)):
                    record.tool_calls += _tool_calls_started(events)  # most steps are one text piece: skipped
                yield events
    finally:
        outcome.reasoning_tokens = parser.reasoning_tokens  # read once the answer is settled, not per step


_CALLS = (ItemKind.TOOL_CALL, ItemKind.SERVER_CALL)


def _tool_calls_started(events: list[Event]) -> int:
    return sum(1 for event in events if type(event) is ItemStarted and event.kind in _CALLS)
