"""How far a generation got and how it ended (`Outcome`): kept current by the generation (`proxy/generation.py`),
read by the request's record (`proxy/telemetry/request_record.py`), its trace and the APIs' usage."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.engines.base import FinishReason, Usage
from proxy.errors import APIError


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
