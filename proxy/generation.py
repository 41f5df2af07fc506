"""Running one engine request: its steps, tracked (`tracked_steps`), and parsed into item events (`parsed_events`).

Both OpenAI APIs consume `parsed_events`, streaming or not, so a streamed answer and a non-streamed one come from
the same events; raw `/v1/completions` uses `tracked_steps`. Closing either iterator early closes the engine's
stream, which cancels the engine request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from parsers.events import Event
from parsers.stream import OutputParser
from parsers.vocab import Vocab
from proxy.engines.base import Engine, EngineError, FinishReason, GenerationRequest, Step, Usage
from proxy.errors import APIError

logger = logging.getLogger("harmony_proxy")


@dataclass
class Outcome:
    """How far the generation got and how it ended; kept current step by step."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int | None = None
    reasoning_tokens: int = 0
    finish_reason: FinishReason | None = None  # None while running, or when the consumer stopped early

    @property
    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)

    def failure(self) -> APIError | None:
        """The error to answer with when the engine cancelled or failed the request itself."""
        if self.finish_reason == "cancelled":
            return APIError(503, "The engine cancelled the request before it finished.", code="engine_cancelled")
        if self.finish_reason == "error":
            return APIError(500, "The engine failed while generating.", type="server_error", code="engine_error")
        return None


async def tracked_steps(engine: Engine, request: GenerationRequest, outcome: Outcome) -> AsyncGenerator[Step, None]:
    """The engine's steps, with the outcome kept current; the last step yielded carries the finish reason.

    An engine that fails with anything but EngineError is logged and reported as an EngineError, so every API
    ends its answer with a clear error rather than a broken connection or a stack trace.
    """
    steps = engine.generate(request)
    try:
        async for step in steps:
            outcome.completion_tokens += len(step.token_ids)
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
    except EngineError:
        raise
    except Exception as exc:  # not GeneratorExit or CancelledError: those are the consumer closing us
        logger.exception("request %s: the %s engine failed", request.request_id, engine.name)
        raise EngineError(f"The {engine.name} engine failed unexpectedly.", status=500, code="engine_error") from exc
    finally:
        if outcome.finish_reason is None:
            logger.info("request %s: stopped after %d generated tokens", request.request_id, outcome.completion_tokens)
        await steps.aclose()


async def parsed_events(
    engine: Engine, request: GenerationRequest, vocab: Vocab, outcome: Outcome
) -> AsyncGenerator[list[Event], None]:
    """Yield the events of each engine step, in order (a step may complete no event: an empty list)."""
    parser = OutputParser(vocab)
    try:
        async with contextlib.aclosing(tracked_steps(engine, request, outcome)) as steps:
            async for step in steps:
                events = parser.feed(step.token_ids)
                if step.finish_reason is not None:
                    events += parser.finish()
                yield events
    finally:
        outcome.reasoning_tokens = parser.reasoning_tokens  # read once the answer is settled, not per step
