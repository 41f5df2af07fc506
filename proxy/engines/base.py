"""The one narrow interface every engine implements: prompt token ids in, generated token ids out.

`Engine.generate(request)` returns an async iterator of `Step`s. Each step carries the newly generated token
ids (one or many: engines with a stream interval send several at once, and an engine that ran ahead of its
consumer hands on everything that waited as one step, so a busy server sends one frame where it would have sent
many), including the stop token that ended generation, because the Harmony parser needs to see `<|call|>`. The last
step carries the finish reason and the token counts. Closing the iterator early (`aclose()`, or cancelling the task
that iterates it) cancels the request: the engine must stop its work and free its slot at once.

Engines report failures by raising `EngineError`; before the first step that becomes an HTTP error, after it
an error event or a failed response.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

from tools.definitions import FunctionTool, ResponseFormat, ToolChoice
from tools.grammar import OutputGrammar, output_grammar

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0  # stop tokens do not end generation before this many tokens
    ignore_eos: bool = False  # generate until max_tokens: stop tokens do not end generation

    def request_fields(self) -> dict[str, Any]:
        """These limits under the names vLLM, TensorRT-LLM and OpenAI-style servers share; unset ones left out."""
        fields: dict[str, Any] = {"max_tokens": self.max_tokens}
        if self.ignore_eos:
            fields["ignore_eos"] = True  # and no stop tokens: generate exactly max_tokens (benchmarks)
        else:
            fields["stop_token_ids"] = list(self.stop_token_ids)
        for name in ("temperature", "top_p", "seed"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.min_tokens:
            fields["min_tokens"] = self.min_tokens
        return fields


@dataclass(frozen=True)
class ContextWindow:
    """What an engine takes, once built: prompt plus output tokens, and the longest prompt."""

    total: int
    prompt: int


@dataclass(frozen=True)
class OutputConstraint:
    """What the output must follow: the tool choice and tools, and a response format.

    Engines with guided decoding enforce `grammar`; the mock engine generates under it.
    """

    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    response_format: ResponseFormat | None = None
    parallel_tool_calls: bool = True

    @cached_property
    def tool_namespaces(self) -> frozenset[str]:
        """The client's namespaces the model may call besides `functions`."""
        return frozenset(tool.namespace for tool in self.tools if tool.namespace is not None)

    @cached_property
    def grammar(self) -> OutputGrammar | None:
        """The grammar of the whole completion, or None when nothing is constrained (built once per request)."""
        return output_grammar(self.tools, self.tool_choice, self.response_format, self.parallel_tool_calls)


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    constraint: OutputConstraint = field(default_factory=OutputConstraint)
    # Keys of the session the request continues (a previous response's id, a prompt_cache_key, a session
    # header), most specific first: engines with several replicas route on them (proxy/engines/upstream/routing.py).
    routing_hints: tuple[str, ...] = ()
    # W3C trace context headers (`traceparent`) of the request's engine span, for an engine that makes HTTP
    # requests (proxy/telemetry/tracing.py); empty when the request is not traced.
    trace_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # prompt tokens served from the KV cache, when the engine knows


@dataclass(slots=True)  # not frozen: one is made per engine step, and a frozen init costs 3x as much
class Step:
    token_ids: Sequence[int]
    finish_reason: FinishReason | None = None  # set on the last step only
    usage: Usage | None = None  # set on the last step only


class EngineError(Exception):
    """A request the engine could not serve. `status` is the HTTP status it should become; `retry_after`
    (seconds) tells the client when to try again (429, 503)."""

    def __init__(self, message: str, status: int = 500, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Engine(Protocol):
    name: str

    @property
    def ready(self) -> bool:
        """True once the engine can take requests (health checks and request gating read this)."""
        ...

    async def check_health(self) -> None:
        """Return when the engine can serve now; raise EngineError (503) saying why not."""
        ...

    async def start(self) -> None:
        """Load models or connect; called once, before requests are served."""
        ...

    # Optional: `context_window: ContextWindow | None`, what the engine takes once started (read after start();
    # the server then advertises and enforces it). Engines without one are held to --max-model-len.
    # Optional: `kv_event_sources: dict | None`, where the engine publishes its KV-cache events, per data-parallel
    # rank, as vLLM's `GET /kv_event_sources` answers (the server then answers that route with it).
    # Optional: `vocab_size: int`, token ids from 0 to it less one (the engine host refuses others: host.py).

    async def close(self) -> None:
        """Release everything; called once at shutdown."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        """Stream the generated tokens of one request; closing the iterator cancels the request."""
        ...


class EngineWrapper:
    """An engine around another that adds something to its requests (admission, tracing, a test's recording):
    everything but `generate` is the inner engine's, and so is `generate` until a wrapper overrides it."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def ready(self) -> bool:
        return self.inner.ready

    async def check_health(self) -> None:
        await self.inner.check_health()

    async def start(self) -> None:
        await self.inner.start()

    @property
    def context_window(self) -> ContextWindow | None:
        return getattr(self.inner, "context_window", None)

    @property
    def kv_event_sources(self) -> dict[str, Any] | None:
        """Where the inner engine publishes its KV-cache events, if it does (`/kv_event_sources`)."""
        return getattr(self.inner, "kv_event_sources", None)

    async def close(self) -> None:
        await self.inner.close()

    def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        return self.inner.generate(request)
