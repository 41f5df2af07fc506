"""What tracing costs a request, in process: the spans of one request made and exported, against none.

    .venv/bin/python benchmarks/tracing_bench.py [--requests N] [--tokens T]

Each request does what a traced Responses request does in the server (proxy/telemetry/tracing.py): its span from an
incoming `traceparent`, a `queue` stage recorded after the fact, a `render` stage, an `engine` span with its
context injected into the request, a `store save` stage, and the request's end; the spans go through the SDK's
BatchSpanProcessor and OTLP/HTTP exporter to a sink in another process, as in production. CPU time is this
process's (the exporter's thread included). "off" runs the same calls with tracing off (no trace on the record:
what every request pays when no OTEL_* setting is given). Spans are per request, so the cost per token is the
request's cost over its tokens: `--tokens` (default 420, benchmarks/load_bench.py's request).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.engines.base import GenerationRequest, SamplingParams
from proxy.outcome import Outcome
from proxy.telemetry.request_record import RequestRecord, current_record, note_admitted
from proxy.telemetry.tracing import RequestTrace, stage, traced_store_operations, tracer_from_environment

HEADERS = [(b"host", b"localhost"), (b"content-type", b"application/json"),
           (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
SINK = ("import sys, time; sys.path.insert(0, 'benchmarks'); from load_bench import OtlpSink; s = OtlpSink(); "
        "print(s.port, flush=True); time.sleep(3600)")


def one_request(tracer: object, request: GenerationRequest, store_operation: object) -> None:
    record = RequestRecord("0123456789abcdef", "POST", "/v1/responses")
    if tracer is not None:
        record.trace = RequestTrace.of_request(tracer, record.method, HEADERS)  # type: ignore[arg-type]
    token = current_record.set(record)
    try:
        note_admitted(0.0001)
        with stage("render"):
            pass
        if record.trace is not None:
            request = record.trace.engine_started(request, "bench")
        outcome = Outcome(len(request.prompt_token_ids), 420, 0, 0, "stop")
        record.outcome, record.response_id = outcome, "resp_0123"
        if record.trace is not None:
            record.trace.engine_ended(outcome, time.perf_counter(), None)
        store_operation("save", 0.0002, True)  # type: ignore[operator]
        record.route, record.api, record.status = "/v1/responses", "responses", 200
        record.finish()
        if record.trace is not None:
            record.trace.finish(record)
    finally:
        current_record.reset(token)


def cpu_per_request(tracer: object, requests: int) -> float:
    request = GenerationRequest("resp_0123", list(range(2000)), SamplingParams(420))
    store_operation = traced_store_operations(None)
    for _ in range(200):  # warm up
        one_request(tracer, request, store_operation)
    started = time.process_time()
    for _ in range(requests):
        one_request(tracer, request, store_operation)
    if tracer is not None:
        from opentelemetry import trace

        trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]  # the export's CPU counts
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--requests", type=int, default=20000)
    options.add_argument("--tokens", type=int, default=420)
    args = options.parse_args()
    sink = subprocess.Popen([sys.executable, "-c", SINK], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())  # type: ignore[union-attr]
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(args.requests * 8)  # nothing dropped: every span is paid for
        tracer = tracer_from_environment()
        off = cpu_per_request(None, args.requests)
        on = cpu_per_request(tracer, args.requests)
    finally:
        sink.terminate()
    print(f"{args.requests} requests, {args.tokens} tokens each; CPU per request, exporter thread included")
    print(f"  tracing off: {off:7.1f} us/request  {off / args.tokens:6.3f} us/token")
    print(f"  tracing on:  {on:7.1f} us/request  {on / args.tokens:6.3f} us/token   ({on / off:.1f}x off)")


if __name__ == "__main__":
    main()
