"""OpenTelemetry tracing: a real server exports its spans over OTLP/HTTP to a receiver the test runs on loopback,
carries `traceparent` to its upstream, continues the caller's trace, and puts nothing private on a span."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.admission import AdmissionQueue, AdmittedEngine
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import scripted_engine
from proxy.state import ServerState
from proxy.store.sqlite import SQLiteResponseStore
from proxy.telemetry.tracing import TracedEngine, traced_store_operations, tracer_from_environment, tracing_requested
from tests.conftest import MODEL, LiveServer
from tests.fake_upstreams import fake_upstream
from tests.mcp_servers import Running
from tests.test_e2e_chat import ANSWER
from tests.test_mcp_loop import ANSWER as MCP_ANSWER
from tests.test_mcp_loop import FORECAST, allowing, mcp_tool
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
SECRET = "zebra-quartz-secret"  # in the prompt: it must appear on no span
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def otlp_receiver() -> Starlette:
    """An OTLP/HTTP trace receiver: protobuf ExportTraceServiceRequests at /v1/traces, their spans kept."""
    spans: list[dict[str, Any]] = []

    async def traces(request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append({
                        "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(), "kind": span.kind, "service": service,
                        "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                    })
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    app.state.spans = spans
    return app


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def headers_seen(app: Any, seen: list[dict[str, str]]) -> Any:
    """`app`, noting the headers of each HTTP request it gets."""

    async def noted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    return noted


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Callable[..., tuple[str, subprocess.Popen[bytes]]]]:
    """server_process(env, *options) -> the base URL of `python -m proxy serve` and its process, stopped at the end;
    waited for as long as it runs."""
    processes: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "server.log"

    def start(env: dict[str, str], *options: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        command = [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--store-path", str(tmp_path / "store.sqlite3"), "--shutdown-timeout", "2", *options]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env
        with log.open("ab") as output:
            processes.append(subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=output, env=environment))
        url, process = f"http://127.0.0.1:{port}", processes[-1]

        def healthy() -> bool:
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        eventually(healthy, still=lambda: process.poll() is None, interval=0.05, why=log.read_text)
        return url, process

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=30)


def test_a_request_is_exported_over_otlp_with_its_stages_and_its_trace_goes_upstream(
    serve_app: Callable[[Any], LiveServer], server_process: Callable[..., tuple[str, subprocess.Popen[bytes]]],
    vocab: Any
) -> None:
    receiver = otlp_receiver()
    collector = serve_app(receiver)
    upstream_headers: list[dict[str, str]] = []
    upstream = serve_app(headers_seen(fake_upstream(vocab, "vllm", ANSWER), upstream_headers))
    url, process = server_process(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.base_url, "OTEL_BSP_SCHEDULE_DELAY": "50",
         "OTEL_SERVICE_NAME": "proxy-under-test"},
        "--engine", "upstream", "--upstream-url", upstream.base_url + "/v1", "--served-model-name", MODEL)

    response = httpx.post(url + "/v1/responses", timeout=30,
                          json={"model": MODEL, "input": f"Weather in Paris? {SECRET}", "store": True},
                          headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
                                   "authorization": "Bearer sk-not-on-any-span"})
    assert response.status_code == 200, response.text
    answer = response.json()

    spans = receiver.state.spans
    # SERVER: the request's own span ends last
    eventually(lambda: any(span["kind"] == 2 and span["trace_id"] == TRACE_ID for span in spans),
               still=lambda: process.poll() is None, interval=0.05, why=lambda: f"the server ended; spans: {spans}")
    assert all(span["trace_id"] == TRACE_ID for span in spans), spans  # health probes are not traced
    (root,) = [span for span in spans if span["kind"] == 2]
    assert root["parent"] == CALLER_SPAN  # the caller's trace continues
    assert root["name"] == "POST /v1/responses"
    assert root["service"] == "proxy-under-test"
    assert root["attributes"]["http.response.status_code"] == 200
    assert root["attributes"]["harmony_proxy.response_id"] == answer["id"]
    assert root["attributes"]["gen_ai.usage.output_tokens"] == answer["usage"]["output_tokens"]
    stages = {span["name"]: span for span in spans if span["parent"] == root["span_id"]}
    assert {"queue", "render", "engine", "store save"} <= set(stages), sorted(stages)
    for stage in stages.values():
        assert root["start"] <= stage["start"] <= stage["end"] <= root["end"], stage
    engine = stages["engine"]["attributes"]
    assert engine["gen_ai.usage.input_tokens"] == answer["usage"]["input_tokens"]
    assert engine["gen_ai.usage.output_tokens"] == answer["usage"]["output_tokens"] > 0
    assert 0 < engine["harmony_proxy.time_to_first_token_s"] < 30
    assert stages["render"]["attributes"]["gen_ai.usage.input_tokens"] == answer["usage"]["input_tokens"]
    assert stages["queue"]["start"] <= stages["engine"]["start"]

    # The upstream got the engine span's context, so its own spans join the same trace.
    (completion_headers,) = [h for h in upstream_headers if "traceparent" in h]
    assert completion_headers["traceparent"] == f"00-{TRACE_ID}-{stages['engine']['span_id']}-01"

    # Nothing private: neither the prompt, the answer, nor the client's key is on any span.
    answer_text = answer["output"][-1]["content"][0]["text"]
    everything = repr(receiver.state.spans)
    for private in (SECRET, "Paris", answer_text, "sk-not-on-any-span"):
        assert private not in everything


def traced_server(serve_app: Callable[[Any], LiveServer], vocab: Any, tmp_path: Path,
                  exporter: InMemorySpanExporter, engine: Any = None, **config: Any) -> LiveServer:
    """A server traced into `exporter` (an SDK provider of its own: the process's global one is left alone),
    wired as the CLI wires a traced server."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = AdmittedEngine(TracedEngine(engine or mock_engine(vocab, 0.0)), AdmissionQueue(1, 8))
    store = SQLiteResponseStore(tmp_path / "store.sqlite3", traced_store_operations(None))
    state = ServerState(ServerConfig(served_model_name=MODEL, **config), vocab, engine, store,
                        tracer=provider.get_tracer("test"))
    return serve_app(create_app(state))


def test_a_background_response_is_a_child_span_of_its_request(
    serve_app: Callable[[Any], LiveServer], vocab: Any, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    server = traced_server(serve_app, vocab, tmp_path, exporter)
    created = httpx.post(server.base_url + "/v1/responses", timeout=30,
                         json={"model": MODEL, "input": "hi", "background": True}).json()
    eventually(lambda: httpx.get(f"{server.base_url}/v1/responses/{created['id']}").json()["status"]
               not in ("queued", "in_progress"), still=server.running, interval=0.05)
    eventually(lambda: any(span.name == "background" for span in exporter.get_finished_spans()),
               still=server.running, interval=0.05)
    spans = exporter.get_finished_spans()
    (post,) = [s for s in spans if s.name == "POST /v1/responses"]
    (background,) = [s for s in spans if s.name == "background"]
    assert background.parent.span_id == post.context.span_id
    (engine,) = [s for s in spans if s.name == "engine"]
    assert engine.parent.span_id == background.context.span_id  # the generation ran after the POST was answered
    assert engine.attributes["gen_ai.usage.output_tokens"] > 0
    assert any(s.name == "store save" and s.parent.span_id == background.context.span_id for s in spans)


def test_each_response_over_a_websocket_is_a_request_span(
    serve_app: Callable[[Any], LiveServer], vocab: Any, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    server = traced_server(serve_app, vocab, tmp_path, exporter)

    async def two_turns() -> None:
        url = server.base_url.replace("http://", "ws://") + "/v1/responses"
        async with websockets.connect(url, additional_headers={
                "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}) as socket:
            for _ in range(2):
                await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": SECRET}))
                while json.loads(await socket.recv())["type"] != "response.completed":  # a hang: pytest-timeout's
                    pass

    asyncio.run(two_turns())
    eventually(lambda: len([s for s in exporter.get_finished_spans() if s.name == "WS /v1/responses"]) >= 2,
               still=server.running, interval=0.05)
    spans = exporter.get_finished_spans()
    turns = [s for s in spans if s.name == "WS /v1/responses"]
    for turn in turns:
        assert f"{turn.context.trace_id:032x}" == TRACE_ID and f"{turn.parent.span_id:016x}" == CALLER_SPAN
        assert turn.attributes["http.response.status_code"] == 200
        stages = {s.name for s in spans if s.parent is not None and s.parent.span_id == turn.context.span_id}
        assert {"render", "engine", "store save"} <= stages
    assert SECRET not in repr([dict(s.attributes) for s in spans])


def test_server_side_tool_calls_are_spans_without_their_arguments(
    serve_app: Callable[[Any], LiveServer], vocab: Any, tmp_path: Path, weather: Running
) -> None:
    exporter = InMemorySpanExporter()
    engine = scripted_engine(vocab, [FORECAST, MCP_ANSWER])
    server = traced_server(serve_app, vocab, tmp_path, exporter, engine, mcp_allow=allowing(weather))
    tool = mcp_tool(weather, headers={"X-Api-Key": SECRET}, require_approval="never")
    body = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, "input": "Weather?", "tools": [tool]},
                      timeout=30).json()
    assert body["status"] == "completed", body
    spans = exporter.get_finished_spans()
    (post,) = [s for s in spans if s.name == "POST /v1/responses"]
    (called,) = [s for s in spans if s.name == "tool"]
    assert called.parent.span_id == post.context.span_id
    assert dict(called.attributes) == {"gen_ai.tool.name": "get_forecast", "harmony_proxy.tool.kind": "mcp"}
    assert [s.name for s in spans].count("engine") == 2  # the model called, then answered with the result
    assert post.attributes["harmony_proxy.tool_calls"] == 1
    shown = repr([(s.name, dict(s.attributes)) for s in spans])
    for private in (SECRET, "Paris", weather.url, "sunny"):
        assert private not in shown


def test_tracing_is_off_unless_the_otel_settings_ask_for_it() -> None:
    assert not tracing_requested({})
    assert not tracing_requested({"OTEL_SERVICE_NAME": "x"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing_requested({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing_requested({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert tracer_from_environment({}) is None
    with pytest.raises(ValueError, match="grpc"):
        tracer_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(ValueError, match="zipkin"):
        tracer_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_a_server_without_otel_settings_never_imports_the_sdk() -> None:
    # (the API package is imported anyway: the mcp library uses it; the SDK and the exporter are ours to load)
    code = ("import sys, os; import proxy.server.serving, proxy.app; from proxy.telemetry.tracing import "
            "tracer_from_environment; assert tracer_from_environment(os.environ) is None; "
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
