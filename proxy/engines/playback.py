"""An engine that plays a completion back as generated tokens, the way a real engine would stream them.

The scripted and mock engines differ only in who writes the completion; this one streams it: one token per step
(or `tokens_per_step`, as TensorRT-LLM's `stream_interval` sends them), `max_tokens` and `min_tokens` honoured,
and a completion that does not end on a stop token finishes with `length`, as a real engine cut off by its token
limit would.

With `token_delay` the engine keeps its own pace, as a GPU does: it steps every request at once, every
`token_delay` seconds, whether or not a request's consumer has taken its last step; a consumer that fell behind
is handed every step generated meanwhile as one (as tokens wait in TensorRT-LLM's result queue or in an
upstream's socket). Without a delay the engine has no pace of its own: it makes a step each time it is asked,
after one turn of the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from proxy.engines.base import EngineError, GenerationRequest, Step, Usage

logger = logging.getLogger("harmony_proxy.engine")

# The completion's token ids; an author with real work to do (the mock under a grammar) returns an awaitable.
Author = Callable[[GenerationRequest], list[int] | Awaitable[list[int]]]


class StepClock:
    """The engine's steps, numbered from the loop clock's zero: step n happens at n * pace.

    Every request waiting for step n waits on one timer, so a step wakes the whole batch in one turn of the loop
    (a timer per request and step cost the server more than the frames it sent)."""

    def __init__(self, pace: float) -> None:
        self.pace = pace
        self._waiting: dict[int, list[asyncio.Future[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> int:
        """The last step that has happened."""
        return int(asyncio.get_running_loop().time() / self.pace)

    async def reach(self, step: int) -> int:
        """Wait for `step` (at least one turn of the loop); return the last step that has happened by then."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests run several): timers of the old one will never fire
            self._loop, self._waiting = loop, {}
        if self.now() >= step:
            await asyncio.sleep(0)
            return self.now()
        woken = loop.create_future()
        waiting = self._waiting.get(step)
        if waiting is None:
            waiting = self._waiting[step] = []
            loop.call_at(step * self.pace, self._wake, step)
        waiting.append(woken)
        await woken
        return max(step, self.now())  # the loop's timers are as coarse as a millisecond: it may wake us early

    def _wake(self, step: int) -> None:
        for woken in self._waiting.pop(step, ()):
            if not woken.done():  # cancelled: its request went away
                woken.set_result(None)


class PlaybackEngine:
    def __init__(self, name: str, author: Author, token_delay: float = 0.0, tokens_per_step: int = 1) -> None:
        self.name = name
        self._author = author
        self._clock = StepClock(token_delay) if token_delay > 0 else None
        self._tokens_per_step = max(1, tokens_per_step)

    @property
    def ready(self) -> bool:
        return True

    async def check_health(self) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        try:
            written = self._author(request)
            tokens = await written if inspect.isawaitable(written) else written
        except EngineError:  # the author's own, with its status (the mock's 400 for a grammar past its limits)
            raise
        except Exception as exc:  # an author that fails is an engine failure, not a server crash
            raise EngineError(f"the {self.name} engine could not produce a completion: {exc}") from exc
        sampling = request.sampling
        stops = frozenset(() if sampling.ignore_eos else sampling.stop_token_ids)
        generated = 0
        finish = "length"
        limit, clock = min(len(tokens), sampling.max_tokens), self._clock
        step_number = clock.now() + 1 if clock is not None else 0  # the engine step that makes our next tokens
        try:
            while generated < limit:
                if clock is None:
                    # Even with no pace, like a real engine, give the event loop (other requests, disconnects) a turn.
                    await asyncio.sleep(0)
                    steps = 1
                else:
                    reached = await clock.reach(step_number)
                    steps, step_number = reached - step_number + 1, reached + 1  # those made while we were away
                step: list[int] = []
                take = steps * self._tokens_per_step
                while len(step) < take and generated < limit:
                    token = tokens[generated]
                    generated += 1
                    step.append(token)
                    if token in stops and generated >= sampling.min_tokens:
                        finish = "stop"
                        break
                yield Step(step)
                if finish == "stop":
                    break
        except (GeneratorExit, asyncio.CancelledError):
            logger.info("%s engine: request %s cancelled after %d tokens", self.name, request.request_id, generated)
            raise
        usage = Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=generated)
        yield Step((), finish, usage)
