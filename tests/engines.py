"""Engines for tests: wrappers around the real scripted engine that add one behaviour each."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from dataclasses import replace

from proxy.engines.base import Engine, EngineError, EngineWrapper, GenerationRequest, Step

Wrapper = EngineWrapper  # delegates everything to the wrapped engine


class Recording(Wrapper):
    """Records each request, and whether its stream was closed before the engine finished it."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.requests: list[GenerationRequest] = []
        self.cancelled = threading.Event()
        self.finished = threading.Event()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        self.requests.append(request)
        steps = self.inner.generate(request)
        done = False
        try:
            async for step in steps:
                done = step.finish_reason is not None
                yield step
        finally:
            (self.finished if done else self.cancelled).set()
            await steps.aclose()


class SlowStart(Wrapper):
    """Not ready until `release` is set."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.release = threading.Event()
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        self._ready = True


class Failing(Wrapper):
    """Raises `error` after `after` steps of the wrapped engine: an EngineError, or any exception (a bug)."""

    def __init__(self, inner: Engine, error: Exception, after: int = 0) -> None:
        super().__init__(inner)
        self.error = error
        self.after = after

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        steps = self.inner.generate(request)
        try:
            count = 0
            async for step in steps:
                if count == self.after:
                    raise self.error
                count += 1
                yield step
        finally:
            await steps.aclose()


class Cached(Wrapper):
    """Reports `cached` prompt tokens in the final usage, as engines with prefix caching do."""

    def __init__(self, inner: Engine, cached: int) -> None:
        super().__init__(inner)
        self.cached = cached

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        async for step in self.inner.generate(request):
            if step.usage is not None:
                step = replace(step, usage=replace(step.usage, cached_tokens=self.cached))
            yield step


class Unhealthy(Wrapper):
    async def check_health(self) -> None:
        raise EngineError("upstream http://10.0.0.1:8000 is not answering", status=503, code="upstream_unavailable")

