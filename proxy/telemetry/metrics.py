"""Prometheus metrics, `GET /metrics`: what every finished request's record says, and a few live gauges.

Names and buckets follow vLLM's (`vllm/v1/metrics/loggers.py`) where the meaning is the same, so its Grafana
dashboards and tools that read `vllm:` metrics (aiperf, autoscalers, routers) work as they are; trtllm-serve
exports the same histograms, with the same buckets, as `trtllm_*`. What vLLM has no name for is
`harmony_proxy:*`. Every metric has the `model_name` label, as vLLM's do.

With `--workers N` each worker writes its values to files in PROMETHEUS_MULTIPROC_DIR (the supervisor makes and
removes the folder, `proxy/server/workers.py`), and a scrape of any worker adds them all up: counters and histograms
over every worker that ever ran, live gauges over the living ones.
"""

from __future__ import annotations

import asyncio
import glob
import os
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from starlette.requests import Request
from starlette.responses import Response

from proxy.telemetry.request_record import ITL_BUCKETS, RequestRecord

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# vLLM's buckets (vllm/v1/metrics/loggers.py); trtllm-serve uses the same ones.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FINISHED_REASONS = {"stop": "stop", "tool_calls": "stop", "length": "length", "abort": "abort",
                    "cancelled": "abort", "error": "error"}  # vLLM's finished_reason values


def one_two_five(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit`: vLLM's buckets for token counts."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class Metrics:
    """The server's metrics, in a registry of their own (several servers can live in one test process)."""

    def __init__(self, model_name: str, engine_name: str, max_model_len: int) -> None:
        self._multiprocess_dir = os.environ.get(MULTIPROCESS_ENV) or None
        self._registry = CollectorRegistry()
        if self._multiprocess_dir is not None:  # the metrics write to files; the scrape reads every process's
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, self._multiprocess_dir)
        else:
            self.exposed = self._registry
        self.engine_registry: CollectorRegistry | None = None  # an in-process engine's own metrics (vLLM's), shown too
        model = {"model_name": model_name}

        def counter(name: str, text: str, *labels: str) -> Any:
            metric = Counter(name, text, ["model_name", *labels], registry=self._registry)
            return metric if labels else metric.labels(**model)

        def histogram(name: str, text: str, buckets: Any, *labels: str) -> Any:
            metric = Histogram(name, text, ["model_name", *labels], buckets=buckets, registry=self._registry)
            return metric if labels else metric.labels(**model)

        def gauge(name: str, text: str, mode: str, *labels: str) -> Any:
            metric = Gauge(name, text, ["model_name", *labels], multiprocess_mode=mode, registry=self._registry)
            return metric if labels else metric.labels(**model)

        self._model = model_name
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # labelled series, looked up once each
        self.running = gauge("vllm:num_requests_running", "Requests admitted and generating.", "livesum")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting in the admission queue.", "livesum")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.cached_tokens = counter("vllm:prompt_tokens_cached", "Prompt tokens the engine served from its cache.")
        self.success = counter("vllm:request_success", "Finished generations, by finish reason.", "finished_reason")
        token_buckets = one_two_five(max_model_len)
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", token_buckets)
        self.request_generation = histogram("vllm:request_generation_tokens", "Generated tokens per request.",
                                            token_buckets)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "From the request's arrival to its first generated token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Between two engine steps of one request.",
                             ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Mean time per generated token after the first, per request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "From arrival to the end of the response.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Time waiting in the admission queue.",
                                    REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", "From admission to the first token.",
                                      REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds", "From the first token to the last.",
                                     REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds", "From admission to the last token.",
                                        REQUEST_LATENCY_BUCKETS)
        self.requests = counter("harmony_proxy:requests", "HTTP requests answered.", "route", "method", "status",
                                "api")
        self.streams = gauge("harmony_proxy:active_streams", "Streaming responses open.", "livesum", "api")
        self.reasoning_tokens = counter("harmony_proxy:reasoning_tokens", "Generated tokens of reasoning.")
        self.tool_calls = counter("harmony_proxy:tool_calls", "Tool calls the model made.", "api")
        self.client_gone = counter("harmony_proxy:client_cancelled_requests",
                                   "Requests whose client left before the answer was complete.", "api")
        self.engine_errors = counter("harmony_proxy:engine_errors", "Requests the engine refused or failed.", "kind")
        self.store_seconds = histogram("harmony_proxy:store_operation_seconds",
                                       "Responses store operations and their latency.", STORE_BUCKETS,
                                       "operation", "outcome")
        self.ready = gauge("harmony_proxy:engine_ready", "1 when the engine serves (in every worker).", "livemin",
                           "engine").labels(model_name, engine_name)
        self.ready.set(0)
        self.running.set(0)
        self.waiting.set(0)
        # The inter-token gaps of a request are added at its end, bucket by bucket (see `_add_gaps`).
        if len(self.itl._buckets) != len(ITL_BUCKETS) + 1:
            raise RuntimeError("prometheus-client's histogram layout changed; update proxy/telemetry/metrics.py")

    def admission_changed(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def engine_ready(self, ready: bool) -> None:
        self.ready.set(1 if ready else 0)

    def stream_opened(self, api: str) -> None:
        self._series(self.streams, api).inc()

    def stream_closed(self, api: str) -> None:
        self._series(self.streams, api).dec()

    def store_operation(self, operation: str, seconds: float, ok: bool) -> None:
        self._series(self.store_seconds, operation, "ok" if ok else "error").observe(seconds)

    def _series(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(model, *labels)`, remembered: labels() checks and converts its values on every call.
        Label values are few (route templates, statuses, APIs, error codes, store operations)."""
        key = (id(metric), labels)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = metric.labels(self._model, *labels)
        return series

    def observe(self, record: RequestRecord) -> None:
        """Count a finished request: called once per request, with its complete record."""
        api = record.api
        if not record.background:
            self._series(self.requests, record.route, record.method, str(record.status), api).inc()
        if record.client_left:
            self._series(self.client_gone, api).inc()
        if record.error_kind is not None:
            self._series(self.engine_errors, record.error_kind).inc()
        outcome = record.outcome
        if outcome is None or record.admitted_at is None or record.ended is None:
            return  # no generation ran: refused, failed before admission, or not a generation route
        self.prompt_tokens.inc(outcome.prompt_tokens)
        self.generation_tokens.inc(outcome.completion_tokens)
        self.reasoning_tokens.inc(outcome.reasoning_tokens)
        if outcome.cached_tokens:
            self.cached_tokens.inc(outcome.cached_tokens)
        if record.tool_calls:
            self._series(self.tool_calls, api).inc(record.tool_calls)
        self._series(self.success, FINISHED_REASONS.get(record.finish_reason or "", "abort")).inc()
        self.request_prompt.observe(outcome.prompt_tokens)
        self.request_generation.observe(outcome.completion_tokens)
        self.e2e.observe(record.ended - record.started)
        self.queue_time.observe(record.queued_seconds or 0.0)
        first, last = record.first_token_at, record.last_token_at
        if first is not None and last is not None:
            self.ttft.observe(first - record.started)
            self.prefill_time.observe(first - record.admitted_at)
            self.decode_time.observe(last - first)
            self.inference_time.observe(last - record.admitted_at)
            if outcome.completion_tokens > 1:
                self.tpot.observe((last - first) / (outcome.completion_tokens - 1))
        if record.gap_counts is not None:
            _add_gaps(self.itl, record.gap_counts, record.gap_sum)

    def exposition(self) -> bytes:
        if self._multiprocess_dir is not None:
            _forget_dead_processes(self._multiprocess_dir)
        if self.engine_registry is None:
            return generate_latest(self.exposed)
        return generate_latest(_Merged(self.exposed, self.engine_registry))  # type: ignore[arg-type]

    def close(self) -> None:
        """This process stops: its live gauges leave the sums of the other workers."""
        if self._multiprocess_dir is not None:
            mark_process_dead(os.getpid(), self._multiprocess_dir)


def _add_gaps(histogram: Any, counts: list[int], total: float) -> None:
    """What `observe()` per gap would have done, in one go: one lock and file write per bucket used rather than
    per token (observe() costs 3-5 us; the token path costs ~25 us a token in all). tests/test_metrics.py checks
    the result against observe()."""
    histogram._sum.inc(total)
    for bucket, count in zip(histogram._buckets, counts, strict=True):
        if count:
            bucket.inc(count)


def _forget_dead_processes(directory: str) -> None:
    """Live gauges of a worker that died without cleaning up (killed) would count forever; drop them."""
    for path in glob.glob(os.path.join(directory, "gauge_live*.db")):
        pid = int(os.path.basename(path).rsplit("_", 1)[1][:-3])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, directory)
        except PermissionError:
            pass  # alive, another user's


class _Merged:
    """Several registries as one exposition: a family both define (harmony-proxy's front-end `vllm:` metrics and vLLM's
    own, which carry an `engine` label) is written once, with the samples of each."""

    def __init__(self, *registries: CollectorRegistry) -> None:
        self._registries = registries

    def collect(self) -> Any:
        families: dict[str, Any] = {}
        for registry in self._registries:
            for family in registry.collect():
                known = families.setdefault(family.name, family)
                if known is not family and known.type == family.type:
                    known.samples.extend(family.samples)
        return families.values()


async def metrics_endpoint(request: Request) -> Response:
    state = request.app.state.harmony
    metrics: Metrics = state.metrics
    metrics.engine_ready(state.engine.ready)
    body = await asyncio.to_thread(metrics.exposition)  # reading every worker's files: off the event loop
    return Response(body, media_type=CONTENT_TYPE_LATEST)
