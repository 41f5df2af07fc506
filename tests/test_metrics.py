"""GET /metrics after real traffic: the openai SDK on a loopback server; counts, not only names."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import proxy.generation
from parsers.vocab import Vocab
from proxy.admission import AdmissionQueue, AdmittedEngine
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.base import Engine, GenerationRequest, SamplingParams, Step
from proxy.engines.scripted import scripted_engine
from proxy.generation import tracked_steps
from proxy.outcome import Outcome
from proxy.state import ServerState
from proxy.store.sqlite import SQLiteResponseStore
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.request_record import ITL_BUCKETS, RequestRecord, current_record
from tests.conftest import MODEL, LiveServer
from tests.engines import Wrapper
from tests.test_e2e_chat import ANSWER, CALL, WEATHER
from tests.test_vocab_and_cli import clean_env, free_port, stop, wait_healthy
from tests.waiting import eventually

LONG = "<|channel|>final<|message|>" + "word " * 300 + "<|return|>"
HI = [{"role": "user", "content": "hi"}]
FAIL_MARK = 77  # max_tokens that makes FailOnMark fail


class FailOnMark(Wrapper):
    """A bug in the engine (an unexpected exception) after one step, for requests with max_tokens FAIL_MARK; counts
    the steps that carry tokens (a paced engine hands a late consumer several tokens in one)."""

    token_steps = 0

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        steps = self.inner.generate(request)
        try:
            async for step in steps:
                self.token_steps += bool(step.token_ids)
                yield step
                if request.sampling.max_tokens == FAIL_MARK:
                    raise RuntimeError("the engine broke")
        finally:
            await steps.aclose()


def observed_server(
    serve_app: Callable[[Any], LiveServer], engine: Engine, vocab: Vocab, tmp_path: Path, limit: int = 8,
    **config: Any,
) -> LiveServer:
    """A server wired as the CLI wires it: admission gauges and store timings go to the metrics."""
    metrics = Metrics(MODEL, engine.name, 131072)
    queue = AdmissionQueue(limit, 8, metrics.admission_changed)
    store = SQLiteResponseStore(tmp_path / "responses.sqlite3", metrics.store_operation)
    state = ServerState(ServerConfig(**config), vocab, AdmittedEngine(engine, queue), store, metrics)
    return serve_app(create_app(state))


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
        return sum(s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items())


def scrape(base_url: str, **headers: str) -> Scrape:
    response = httpx.get(base_url + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


def scrape_once(base_url: str, name: str, at_least: float, **labels: str) -> Scrape | None:
    """A scrape once `name` (with `labels`) has reached `at_least`; None before."""
    scraped = scrape(base_url)
    return scraped if scraped.value(name, **labels) >= at_least else None


def test_counts_after_chat_responses_a_tool_call_a_client_that_leaves_a_4xx_and_an_engine_error(
    serve_app: Callable[[Any], LiveServer], vocab: Vocab, tmp_path: Path
) -> None:
    engine = FailOnMark(scripted_engine(vocab, [ANSWER, CALL, ANSWER, LONG, ANSWER], 0.002))
    server = observed_server(serve_app, engine, vocab, tmp_path)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
    prompt = httpx.post(server.base_url + "/tokenize", json={"model": MODEL, "messages": HI}).json()["count"]

    plain = client.chat.completions.create(model=MODEL, messages=HI)  # ANSWER
    assert plain.usage.prompt_tokens == prompt
    stream = client.chat.completions.create(model=MODEL, messages=HI, tools=[WEATHER], stream=True,
                                            stream_options={"include_usage": True})  # CALL
    called = [chunk for chunk in stream]
    assert called[-2].choices[0].finish_reason == "tool_calls"
    call_usage = called[-1].usage
    response = client.responses.create(model=MODEL, input="hi")  # ANSWER, stored
    assert client.responses.retrieve(response.id).id == response.id
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=HI)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    # A client that leaves mid-stream (LONG), then an engine that breaks (the next ANSWER).
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=10,
                      json={"model": MODEL, "messages": HI, "stream": True}) as leaving:
        lines = leaving.iter_lines()
        while '"content":"word' not in next(lines):
            pass
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=FAIL_MARK)

    # The leaving stream's end is recorded as soon as the server notices.
    eventually(lambda: scrape_once(server.base_url, "harmony_proxy:client_cancelled_requests_total", 1),
               still=server.running, interval=0.02)
    metrics = scrape(server.base_url)
    value = metrics.value
    chat = {"route": "/v1/chat/completions", "api": "chat.completions", "method": "POST"}
    assert value("harmony_proxy:requests_total", status="200", **chat) == 3  # plain, tool call, the one that left
    assert value("harmony_proxy:requests_total", status="404", **chat) == 1
    assert value("harmony_proxy:requests_total", status="400", **chat) == 1
    assert value("harmony_proxy:requests_total", status="500", **chat) == 1
    assert value("harmony_proxy:requests_total", route="/v1/responses", api="responses", status="200") == 1
    assert value("harmony_proxy:requests_total", route="/v1/responses/{response_id}", method="GET") == 1
    assert value("harmony_proxy:requests_total", route="/tokenize", status="200") == 1

    admitted = 5  # plain, tool call, response, the one that left, the broken one
    assert value("vllm:request_success_total", model_name=MODEL) == admitted
    assert value("vllm:request_success_total", finished_reason="stop") == 3
    assert value("vllm:request_success_total", finished_reason="abort") == 1
    assert value("vllm:request_success_total", finished_reason="error") == 1
    assert call_usage.prompt_tokens > prompt  # its tools are declared in the prompt
    assert value("vllm:prompt_tokens_total") == 3 * prompt + call_usage.prompt_tokens + response.usage.input_tokens
    generated = value("vllm:generation_tokens_total")
    assert generated > plain.usage.completion_tokens + call_usage.completion_tokens + response.usage.output_tokens
    assert value("vllm:request_generation_tokens_sum") == generated
    assert value("harmony_proxy:reasoning_tokens_total") == (
        plain.usage.completion_tokens_details.reasoning_tokens
        + call_usage.completion_tokens_details.reasoning_tokens
        + response.usage.output_tokens_details.reasoning_tokens
    )
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens"):
        assert value(histogram + "_count") == admitted, histogram
    # Observed per engine step: every step but each request's first closes a gap.
    assert engine.token_steps <= generated
    assert value("vllm:inter_token_latency_seconds_count") == engine.token_steps - admitted
    assert value("vllm:inter_token_latency_seconds_bucket", le="+Inf") == engine.token_steps - admitted
    assert 0 < value("vllm:inter_token_latency_seconds_sum") < 60
    assert value("harmony_proxy:tool_calls_total", api="chat.completions") == 1
    assert value("harmony_proxy:client_cancelled_requests_total", api="chat.completions") == 1
    assert value("harmony_proxy:engine_errors_total", kind="engine_error") == 1
    assert value("harmony_proxy:store_operation_seconds_count", operation="save", outcome="ok") == 1
    assert value("harmony_proxy:store_operation_seconds_count", operation="load", outcome="ok") == 1
    assert value("vllm:num_requests_running") == 0 and value("vllm:num_requests_waiting") == 0
    assert value("harmony_proxy:active_streams") == 0
    assert value("harmony_proxy:engine_ready", engine="scripted") == 1
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="openai/gpt-oss-20b"}' in metrics.text


def test_gauges_show_running_queued_and_streaming_requests_while_they_last(
    serve_app: Callable[[Any], LiveServer], vocab: Vocab, tmp_path: Path
) -> None:
    server = observed_server(serve_app, scripted_engine(vocab, [LONG], 0.01), vocab, tmp_path, limit=1)
    body = {"model": MODEL, "messages": HI, "stream": True}

    async def load() -> Scrape:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=20) as http:
            async def stream() -> None:
                async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass

            streams = [asyncio.create_task(stream()) for _ in range(3)]
            # Until one generates (3 s of tokens), its headers sent, and two wait for its slot: as long as none has
            # ended (the control: a stream that ends lets the next one in, and then they are never all in).
            while True:
                during = Scrape((await http.get("/metrics")).text)
                if (during.value("vllm:num_requests_running") == 1 and during.value("vllm:num_requests_waiting") == 2
                        and during.value("harmony_proxy:active_streams") >= 1):
                    break
                assert not any(task.done() for task in streams), "a stream ended before all three were in"
                await asyncio.sleep(0.02)
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
            return during

    during = asyncio.run(load())
    assert during.value("vllm:num_requests_running") == 1
    assert during.value("vllm:num_requests_waiting") == 2
    assert during.value("harmony_proxy:active_streams", api="chat.completions") == 1  # queued ones sent no headers
    after = eventually(lambda: scrape_once(server.base_url, "harmony_proxy:requests_total", 3,
                                           route="/v1/chat/completions"), still=server.running, interval=0.05)
    assert after.value("vllm:num_requests_running") == 0 and after.value("vllm:num_requests_waiting") == 0
    assert after.value("harmony_proxy:active_streams") == 0
    assert after.value("harmony_proxy:client_cancelled_requests_total") == 3


def test_a_background_response_is_measured_when_it_ends(
    serve_app: Callable[[Any], LiveServer], vocab: Vocab, tmp_path: Path
) -> None:
    server = observed_server(serve_app, scripted_engine(vocab, [ANSWER], 0.01), vocab, tmp_path)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
    queued = client.responses.create(model=MODEL, input="hi", background=True)
    eventually(lambda: client.responses.retrieve(queued.id).status not in ("queued", "in_progress"),
               still=server.running, interval=0.05)
    done = client.responses.retrieve(queued.id)
    metrics = eventually(lambda: scrape_once(server.base_url, "vllm:request_success_total", 1), still=server.running,
                         interval=0.05)
    assert metrics.value("vllm:request_success_total", finished_reason="stop") == 1
    assert metrics.value("vllm:generation_tokens_total") == done.usage.output_tokens
    assert metrics.value("vllm:time_to_first_token_seconds_count") == 1
    assert metrics.value("harmony_proxy:requests_total", route="/v1/responses", method="POST") == 1  # once


def test_metrics_follow_the_api_key_unless_public(serve: Callable[..., LiveServer]) -> None:
    guarded = serve(api_key="sekrit")
    refused = httpx.get(guarded.base_url + "/metrics")
    assert refused.status_code == 401 and len(refused.headers["x-request-id"]) == 32
    assert scrape(guarded.base_url, authorization="Bearer sekrit").value("harmony_proxy:requests_total") >= 1
    public = serve(api_key="sekrit", metrics_public=True)
    assert scrape(public.base_url).value("harmony_proxy:engine_ready") == 1
    assert httpx.get(public.base_url + "/v1/models").status_code == 401  # only /metrics is opened


def test_inter_token_gaps_counted_on_the_token_path_equal_one_observation_per_gap(
    vocab: Vocab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generation counts gaps into buckets and the metrics add the counts at the end: the histogram must be
    what one observe() per gap gives (prometheus-client's own bucketing), boundaries included."""
    randomness = random.Random(7)
    clock = [0.0]
    for _ in range(600):  # the generation reads the clock once at its start, then once per step with tokens
        clock.append(clock[-1] + randomness.choice([0.0004, 0.01, 0.3, 2.0, 99.0, randomness.random()]))
    readings = iter(clock)
    monkeypatch.setattr(proxy.generation, "perf_counter", lambda: next(readings))
    engine = scripted_engine(vocab, [LONG])
    request = GenerationRequest("cmpl-1", vocab.encode_harmony("<|start|>user<|message|>hi<|end|><|start|>assistant"),
                                SamplingParams(max_tokens=4000, stop_token_ids=vocab.stop_token_ids))
    record = RequestRecord("id", "POST", "/v1/completions")
    outcome = Outcome(prompt_tokens=len(request.prompt_token_ids))

    async def generate() -> None:
        current_record.set(record)
        async for _ in tracked_steps(engine, request, outcome):
            pass

    asyncio.run(generate())
    record.finish()
    steps = outcome.completion_tokens  # one token a step
    registry = CollectorRegistry()
    reference = Histogram("gaps", "", buckets=ITL_BUCKETS, registry=registry)
    for index in range(2, steps + 1):
        reference.observe(clock[index] - clock[index - 1])
    metrics = Metrics(MODEL, "scripted", 131072)
    metrics.observe(record)
    ours = Scrape(metrics.exposition().decode())
    theirs = Scrape(generate_latest(registry).decode())
    for bound in [*ITL_BUCKETS, "+Inf"]:
        le = str(float(bound)) if bound != "+Inf" else bound
        assert ours.value("vllm:inter_token_latency_seconds_bucket", le=le) == theirs.value("gaps_bucket", le=le)
    assert ours.value("vllm:inter_token_latency_seconds_count") == steps - 1 > 250
    assert ours.value("vllm:inter_token_latency_seconds_sum") == pytest.approx(theirs.value("gaps_sum"))
    assert ours.value("vllm:time_to_first_token_seconds_count") == 1


def test_workers_add_up_their_metrics_and_the_supervisor_removes_the_folder(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": ANSWER}) + "\n")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--engine", "scripted", "--script", str(script), "--port", str(port),
         "--workers", "2", "--store-path", str(tmp_path / "store.sqlite3")],
        env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    requests = 0
    try:
        wait_healthy(port, process)
        base = f"http://127.0.0.1:{port}"

        def counting_workers() -> set[str]:
            folders = list(Path(tmp_path).glob("harmony-proxy-metrics-*"))
            return {path.stem.rsplit("_", 1)[1] for folder in folders for path in folder.glob("counter_*.db")}

        # A new connection each: the kernel spreads them over the workers, as soon as both accept (on a busy
        # machine one may still be starting): requests go on until both have counted some, 24 at least.
        while requests < 24 or len(counting_workers()) < 2:
            assert process.poll() is None and requests < 2000, "a worker never answered"
            answer = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": HI}, timeout=10)
            assert answer.status_code == 200
            usage = answer.json()["usage"]
            requests += 1
        folder = next(Path(tmp_path).glob("harmony-proxy-metrics-*"))
        assert len(counting_workers()) == 2  # both workers write their counts there
        for _ in range(8):  # whichever worker answers, it reports everyone's
            metrics = scrape(base)
            assert metrics.value("vllm:request_success_total", finished_reason="stop") == requests
            assert metrics.value("vllm:generation_tokens_total") == requests * usage["completion_tokens"]
            assert metrics.value("harmony_proxy:requests_total", route="/v1/chat/completions") == requests
            assert metrics.value("harmony_proxy:engine_ready") == 1  # ready in every worker
            assert metrics.value("vllm:num_requests_running") == 0
    finally:
        output = stop(process)
    assert "the workers' metrics are gathered in" in output
    assert not folder.exists()
