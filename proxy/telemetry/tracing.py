"""OpenTelemetry tracing, configured by the standard `OTEL_*` settings, off unless they ask for it.

With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, or `OTEL_TRACES_EXPORTER`
naming an exporter (`otlp`, `console`), each server process sets up the SDK's tracer provider once
(`tracer_from_environment`); otherwise nothing here imports the SDK and a request carries no trace.

A traced request has one span (`RequestTrace`), opened by the HTTP observer with the incoming W3C
`traceparent` as its parent, and children for the stages: `queue` (admission), `render`, `engine` (time to
first token and token counts; its context goes to an upstream engine as `traceparent`), each store operation
and each server-side tool call. Stages that only learn their length at the end (queueing, store operations)
are recorded after the fact with their real start and end times. Spans are per request and per stage, never
per token. Nothing private goes on a span: no prompt, no output, no tool arguments, no keys, no URLs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from proxy.engines.base import EngineWrapper, GenerationRequest, Step
from proxy.telemetry.request_record import current_record

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from parsers.render import Renderer
    from proxy.outcome import Outcome
    from proxy.telemetry.request_record import RequestRecord

logger = logging.getLogger("harmony_proxy")
_EXPORTERS = ("otlp", "console")


def tracing_requested(environ: Mapping[str, str]) -> bool:
    """Whether the `OTEL_*` settings ask for traces: an exporter named, or an OTLP endpoint given."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def tracer_from_environment(environ: Mapping[str, str] = os.environ) -> Tracer | None:
    """The tracer of this process, its provider set up from the `OTEL_*` settings; None when they ask for none.

    The SDK reads the rest itself: endpoint, headers, timeout and compression (the OTLP exporter), the sampler
    (`OTEL_TRACES_SAMPLER`), the batch limits (`OTEL_BSP_*`), the resource (`OTEL_SERVICE_NAME`,
    `OTEL_RESOURCE_ATTRIBUTES`) and the propagators (`OTEL_PROPAGATORS`)."""
    if not tracing_requested(environ):
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    names = [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if name.strip()]
    unknown = [name for name in names if name not in _EXPORTERS]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {', '.join(unknown)} (use otlp or console)")
    defaults = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "harmony-proxy"}
    provider = TracerProvider(resource=Resource.create(defaults))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    trace.set_tracer_provider(provider)
    logger.info("tracing: exporting spans (%s)", ", ".join(names))
    return trace.get_tracer("harmony_proxy")


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol.strip() != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol} is not supported here (use http/protobuf)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class RequestTrace:
    """One request's span and its stages. The observer opens it; the request's record carries it."""

    def __init__(self, tracer: Tracer, name: str, headers: list[tuple[bytes, bytes]] | None,
                 parent: Span | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        from opentelemetry import propagate, trace

        self._tracer = tracer
        # perf_counter readings (what the record holds) to the wall-clock nanoseconds spans need
        self._offset = time.time_ns() - time.perf_counter_ns()
        if parent is not None:
            context = trace.set_span_in_context(parent)
        else:
            context = propagate.extract({name.decode("latin-1"): value.decode("latin-1")
                                         for name, value in headers or ()})
        self.span = tracer.start_span(name, context, kind=trace.SpanKind.SERVER if parent is None else
                                      trace.SpanKind.INTERNAL, attributes=attributes)
        self._context = trace.set_span_in_context(self.span)
        self._engine_span: Span | None = None
        self._engine_started = 0.0

    @classmethod
    def of_request(cls, tracer: Tracer, method: str, headers: list[tuple[bytes, bytes]]) -> RequestTrace:
        return cls(tracer, method, headers, attributes={"http.request.method": method})

    def detached(self, name: str) -> RequestTrace:
        """A trace for work that outlives the request (a background response), a child of this request's span."""
        return RequestTrace(self._tracer, name, None, parent=self.span)

    def ns(self, perf: float) -> int:
        return int(perf * 1e9) + self._offset

    def record_stage(self, name: str, started: float, ended: float, attributes: Mapping[str, Any] | None = None,
                     ok: bool = True) -> None:
        """A stage that has ended, from `perf_counter` readings."""
        span = self._tracer.start_span(name, self._context, attributes=attributes, start_time=self.ns(started))
        if not ok:
            _failed(span)
        span.end(end_time=self.ns(ended))

    def start_stage(self, name: str, attributes: Mapping[str, Any] | None = None) -> Span:
        return self._tracer.start_span(name, self._context, attributes=attributes)

    def engine_started(self, request: GenerationRequest, engine: str) -> GenerationRequest:
        """Open the `engine` span of a request reaching the engine; the request, with the span's context."""
        from opentelemetry import propagate
        from opentelemetry import trace as api

        self.end_engine()  # (a previous one the generation did not end)
        self._engine_started = time.perf_counter()
        span = self._engine_span = self.start_stage("engine", {
            "harmony_proxy.engine": engine, "gen_ai.usage.input_tokens": len(request.prompt_token_ids)})
        carrier: dict[str, str] = {}
        propagate.inject(carrier, api.set_span_in_context(span))
        return replace(request, trace_headers=tuple(carrier.items()))

    def engine_ended(self, outcome: Outcome, first_token_at: float | None, error: str | None) -> None:
        """End the `engine` span with the generation's outcome: tokens, time to first token, how it ended."""
        span = self._engine_span
        if span is None:
            return
        span.set_attribute("gen_ai.usage.output_tokens", outcome.completion_tokens)
        if outcome.cached_tokens is not None:
            span.set_attribute("gen_ai.usage.cached_tokens", outcome.cached_tokens)
        if outcome.finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (outcome.finish_reason,))
        if first_token_at is not None:
            span.set_attribute("harmony_proxy.time_to_first_token_s", first_token_at - self._engine_started)
        if error is not None or outcome.finish_reason in ("error", "cancelled"):
            _failed(span, error or outcome.finish_reason)
        self.end_engine()

    def end_engine(self) -> None:
        if self._engine_span is not None:
            span, self._engine_span = self._engine_span, None
            span.end()

    def finish(self, record: RequestRecord) -> None:
        """End the request's span with what the record says about it."""
        self.end_engine()
        span = self.span
        attributes: dict[str, Any] = {"harmony_proxy.request_id": record.request_id, "harmony_proxy.api": record.api}
        if record.route != "unmatched":
            attributes["http.route"] = record.route
        if record.status:
            attributes["http.response.status_code"] = record.status
        if record.response_id is not None:
            attributes["harmony_proxy.response_id"] = record.response_id
        if record.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = (record.finish_reason,)
        if record.outcome is not None:
            attributes["gen_ai.usage.input_tokens"] = record.outcome.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = record.outcome.completion_tokens
        if record.tool_calls:
            attributes["harmony_proxy.tool_calls"] = record.tool_calls
        if record.client_left:
            attributes["harmony_proxy.client_left"] = True
        span.set_attributes(attributes)
        if record.status >= 500 or record.error_kind is not None:
            _failed(span, record.error_kind)
        if not record.background and record.route != "unmatched":
            span.update_name(f"{record.method} {record.route}")
        span.end(end_time=self.ns(record.ended) if record.ended is not None else None)


def _failed(span: Span, description: str | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


def current_trace() -> RequestTrace | None:
    record = current_record.get()
    return record.trace if record is not None else None


@contextmanager
def stage(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A span for a stage of the current request, while the block runs; nothing when it is not traced."""
    trace = current_trace()
    if trace is None:
        yield None
        return
    span = trace.start_stage(name, attributes)
    try:
        yield span
    except BaseException as exc:
        _failed(span, type(exc).__name__)
        raise
    finally:
        span.end()


def traced_store_operations(
    on_operation: Callable[[str, float, bool], None] | None,
) -> Callable[[str, float, bool], None]:
    """A store's `on_operation` callback that also records each operation as a span of the current request."""

    def observed(operation: str, seconds: float, ok: bool) -> None:
        if on_operation is not None:
            on_operation(operation, seconds, ok)
        trace = current_trace()
        if trace is not None:
            now = time.perf_counter()
            trace.record_stage("store " + operation, now - seconds, now, {"db.operation.name": operation}, ok)

    return observed


class TracedEngine(EngineWrapper):
    """An engine whose requests open an `engine` span of the current request as they reach the engine (after
    admission), with the span's context in the request (`traceparent`). The generation ends the span
    (`RequestTrace.engine_ended`, from proxy/generation.py): nothing is added per step."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # what a particular engine offers besides (an upstream's router)

    def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        trace = current_trace()
        if trace is not None:  # None outside a traced request (a WebSocket's turns, tests driving the engine)
            request = trace.engine_started(request, self.name)
        return self.inner.generate(request)


class TracedRenderer:
    """A renderer whose prompt renders are `render` spans of the current request (token counts only)."""

    def __init__(self, inner: Renderer) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def render_off_loop(self, prompt: Any) -> list[int]:
        with stage("render", {"harmony_proxy.items": len(prompt.items)}) as span:
            tokens = await self.inner.render_off_loop(prompt)
            if span is not None:
                span.set_attribute("gen_ai.usage.input_tokens", len(tokens))
            return tokens

    async def render_items(self, items: Any) -> list[int]:
        with stage("render", {"harmony_proxy.items": len(items)}) as span:
            tokens = await self.inner.render_items(items)
            if span is not None:
                span.set_attribute("harmony_proxy.tokens", len(tokens))
            return tokens
