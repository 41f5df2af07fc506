"""Fair admission (--max-concurrent-requests, --max-queue) and worker processes (--workers)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from parsers.vocab import Vocab
from proxy.admission import AdmissionQueue, AdmittedEngine
from proxy.engines.base import EngineError
from proxy.engines.scripted import scripted_engine
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER
from tests.test_trtllm import events, model_folder
from tests.test_trtllm_cli import fake_env
from tests.test_vocab_and_cli import clean_env, free_port, stop, wait_healthy
from tests.waiting import eventually

MODEL = "openai/gpt-oss-20b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
LONG = "<|channel|>final<|message|>" + "word " * 200 + "<|return|>"


def test_queue_serves_first_come_first_served_and_refuses_past_its_length() -> None:
    async def scenario() -> tuple[list[int], EngineError]:
        queue = AdmissionQueue(max_concurrent=1, max_queue=2)
        order: list[int] = []
        await queue.enter()  # the running request

        async def waiter(number: int) -> None:
            await queue.enter()
            order.append(number)
            await asyncio.sleep(0)
            queue.leave()

        waiting = [asyncio.create_task(waiter(n)) for n in (1, 2)]
        await asyncio.sleep(0)
        assert (queue.active, queue.queued) == (1, 2)
        try:
            await queue.enter()
        except EngineError as exc:
            refused = exc
        queue.leave()  # the running request ends: its slot goes to the head of the line
        await asyncio.gather(*waiting)
        assert (queue.active, queue.queued) == (0, 0)
        return order, refused

    order, refused = asyncio.run(scenario())
    assert order == [1, 2]
    assert refused.status == 429 and refused.retry_after == 1 and refused.code == "server_overloaded"


def test_a_cancelled_waiter_leaves_the_line_at_once_and_never_leaks_a_slot() -> None:
    async def scenario() -> None:
        queue = AdmissionQueue(max_concurrent=1, max_queue=4)
        await queue.enter()
        first = asyncio.create_task(queue.enter())
        second = asyncio.create_task(queue.enter())
        await asyncio.sleep(0)
        first.cancel()  # a client that left while queued
        await asyncio.sleep(0)
        assert queue.queued == 1
        queue.leave()
        await second
        assert (queue.active, queue.queued) == (1, 0)
        # Cancelled just as the slot was handed to it: the slot goes on to the next in line.
        third = asyncio.create_task(queue.enter())
        await asyncio.sleep(0)
        queue.leave()
        third.cancel()
        await asyncio.sleep(0)
        assert (queue.active, queue.queued) == (0, 0)

    asyncio.run(scenario())


def _stream_first_token(base_url: str, started: threading.Event, results: list[object]) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    try:
        with client.chat.completions.create(**CHAT, stream=True) as stream:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    started.set()
            results.append("done")
    except Exception as exc:  # noqa: BLE001 - recorded for the assertion
        results.append(exc)


def test_over_http_requests_queue_then_get_429_with_retry_after(serve, vocab: Vocab) -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queue=1)
    engine = Recording(AdmittedEngine(scripted_engine(vocab, [LONG], token_delay=0.005), queue))
    server = serve(engine=engine)
    results: list[object] = []
    started = threading.Event()
    running = threading.Thread(target=_stream_first_token, args=(server.base_url, started, results))
    running.start()
    assert started.wait(10)
    queued = threading.Thread(target=_stream_first_token, args=(server.base_url, threading.Event(), results))
    queued.start()
    eventually(lambda: queue.queued == 1, still=running.is_alive)  # queued while the first one streams

    refused = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=10)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["error"]["code"] == "server_overloaded"
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**CHAT)

    running.join(30)
    queued.join(30)
    assert results == ["done", "done"]  # the queued request was served once the first one ended
    assert (queue.active, queue.queued) == (0, 0)


def test_a_client_that_disconnects_while_queued_leaves_the_queue(serve, vocab: Vocab) -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queue=4)
    server = serve(engine=AdmittedEngine(scripted_engine(vocab, [LONG], token_delay=0.01), queue))
    started = threading.Event()
    running = threading.Thread(target=_stream_first_token, args=(server.base_url, started, []))
    running.start()
    assert started.wait(10)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=0.5)
    eventually(lambda: queue.queued == 0, still=running.is_alive)  # gone before the running stream ends
    assert running.is_alive()
    running.join(30)


def test_workers_share_the_port_and_the_first_log_lines_say_so(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text('{"completion": "<|channel|>final<|message|>Hello.<|return|>"}\n')
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--engine", "scripted", "--script", str(script), "--port", str(port),
         "--workers", "2", "--max-concurrent-requests", "8", "--store-path", str(tmp_path / "store.sqlite3")],
        env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_healthy(port, process)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        for _ in range(6):
            assert client.chat.completions.create(**CHAT).choices[0].message.content == "Hello."
    finally:
        output = stop(process)
    assert "event loop uvloop, HTTP parser httptools, 2 worker processes" in output.splitlines()[0]
    assert output.count("Started server process") == 2
    assert output.count("accepts every waiting connection at once") == 2  # each worker drains its accept queue
    assert output.count("admitting 8 requests at once per worker, 8 more in line") == 2


def test_trtllm_workers_share_one_engine_process_built_in_its_main_thread(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER, LONG], load_seconds="1.5", step_seconds="0.01")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", str(folder), "--port", str(port), "--workers", "2",
         "--max_batch_size", "16", "--served-model-name", MODEL, "--store-path", str(tmp_path / "store.sqlite3")],
        env=fake_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        saw_loading = False
        while True:  # as long as it runs
            assert process.poll() is None, "the server stopped"
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if health.status_code == 503:
                saw_loading = True  # the front ends answer while the engine process loads the model
            if health.status_code == 200:
                break
            time.sleep(0.05)
        assert saw_loading
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        answer = client.chat.completions.create(**CHAT)
        assert answer.choices[0].message.content == "It is 18C."
        # A client that leaves mid-stream: the abort crosses from the front end to the engine process.
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json={**CHAT, "stream": True},
                          timeout=10) as stream:
            for line in stream.iter_lines():
                if '"content":"word' in line:
                    break
        eventually(lambda: any(e["event"] == "abort" for e in events(folder)), still=lambda: process.poll() is None,
                   interval=0.05)
    finally:
        output = stop(process)
    inits = [e for e in events(folder) if e["event"] == "init"]
    assert len(inits) == 1 and inits[0]["main_thread"]  # one LLM, built in the engine process's main thread
    assert inits[0]["pid"] != process.pid
    assert any(e["event"] == "abort" for e in events(folder))
    assert any(e["event"] == "shutdown" for e in events(folder))
    assert "admitting 8 requests at once per worker" in output  # the batch of 16, shared by 2 front ends
