"""An engine that plays a completion back as generated tokens, the way a real engine would stream them.

The scripted and mock engines differ only in who writes the completion; this one streams it: one token per step
(or `tokens_per_step`, as TensorRT-LLM's `stream_interval` sends them), an optional delay between steps, `max_tokens` and `min_tokens` honoured, and a completion that does not end
on a stop token finishes with `length`, as a real engine cut off by its token limit would.
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


class PlaybackEngine:
    def __init__(self, name: str, author: Author, token_delay: float = 0.0, tokens_per_step: int = 1) -> None:
        self.name = name
        self._author = author
        self._token_delay = token_delay
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
        except Exception as exc:  # an author that fails is an engine failure, not a server crash
            raise EngineError(f"the {self.name} engine could not produce a completion: {exc}") from exc
        sampling = request.sampling
        stops = frozenset(() if sampling.ignore_eos else sampling.stop_token_ids)
        generated = 0
        finish = "length"
        per_step, limit = self._tokens_per_step, min(len(tokens), sampling.max_tokens)
        try:
            while generated < limit:
                # Sleep even for 0 s: like a real engine, give the event loop (other requests, disconnects) a turn.
                await asyncio.sleep(self._token_delay)
                step: list[int] = []
                while len(step) < per_step and generated < limit:
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
