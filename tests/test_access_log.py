"""Access logs: one line per request with its id, tokens and timings; x-request-id; no prompt or key unless asked."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.telemetry.access_log import JsonFormatter, RequestIdFilter, TextFormatter
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER, CALL, WEATHER
from tests.test_vocab_and_cli import clean_env, free_port, stop, wait_healthy
from tests.waiting import eventually

LONG = "<|channel|>final<|message|>" + "word " * 300 + "<|return|>"
PROMPT = "purple elephant 4711"  # text that must not reach the logs unless --log-requests
KEY = "sekrit-key-999"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="harmony_proxy")
    request_ids = RequestIdFilter()
    caplog.handler.addFilter(request_ids)  # as configure_logging puts it on the server's handler
    yield caplog
    caplog.handler.removeFilter(request_ids)


def access_line(logs: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    """The access line's fields for a request (it is written just after the answer went out: waited for)."""
    while True:
        found = [r for r in logs.records if r.name == "harmony_proxy.access" and r.request_id == request_id]
        if found:
            assert len(found) == 1, "one access line per request"
            return found[0].fields  # type: ignore[attr-defined]
        time.sleep(0.01)


def everything_logged(logs: pytest.LogCaptureFixture) -> str:
    text, json_ = TextFormatter(), JsonFormatter()
    return "\n".join(text.format(r) + "\n" + json_.format(r) for r in logs.records)


def test_streamed_and_non_streamed_requests_each_get_one_line_with_tokens_and_timings(
    serve: Callable[..., LiveServer], logs: pytest.LogCaptureFixture
) -> None:
    server = serve(completions=[ANSWER, CALL], token_delay=0.002)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)

    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    plain, plain_id = raw.parse(), raw.headers["x-request-id"]
    line = access_line(logs, plain_id)
    assert line["method"] == "POST" and line["path"] == "/v1/chat/completions" and line["status"] == 200
    assert line["model"] == MODEL and line["response_id"] == plain.id and line["api"] == "chat.completions"
    assert line["prompt_tokens"] == plain.usage.prompt_tokens
    assert line["completion_tokens"] == plain.usage.completion_tokens
    assert line["reasoning_tokens"] == plain.usage.completion_tokens_details.reasoning_tokens > 0
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    assert line["finish_reason"] == "stop" and line["client_left"] is False and line["streamed"] is False

    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], stream=True,
        stream_options={"include_usage": True},
    ) as response:
        stream_id = response.headers["x-request-id"]
        usage = [chunk for chunk in response.parse()][-1].usage
    line = access_line(logs, stream_id)
    assert stream_id != plain_id and line["streamed"] is True and line["status"] == 200
    assert (line["prompt_tokens"], line["completion_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
    assert line["reasoning_tokens"] == usage.completion_tokens_details.reasoning_tokens
    assert line["finish_reason"] == "tool_calls" and line["tool_calls"] == 1
    assert 0 < line["ttft_ms"] < line["duration_ms"]
    text = [TextFormatter().format(r) for r in logs.records if getattr(r, "request_id", "") == stream_id]
    assert any(f"[{stream_id}]: POST /v1/chat/completions 200 " in entry and "ttft_ms=" in entry for entry in text)


def test_a_client_request_id_is_kept_a_bad_one_replaced_and_every_response_has_one(
    serve: Callable[..., LiveServer], logs: pytest.LogCaptureFixture
) -> None:
    logs.set_level(logging.DEBUG, logger="harmony_proxy")  # /health's line is a debug one
    server = serve(completions=[ANSWER])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    kept = httpx.post(server.base_url + "/v1/chat/completions", json=body, headers={"x-request-id": "trace-42.a:b"})
    assert kept.headers["x-request-id"] == "trace-42.a:b"
    assert access_line(logs, "trace-42.a:b")["status"] == 200
    for bad in ("x" * 200, "has space", "semi;colon<>"):
        answer = httpx.get(server.base_url + "/v1/models", headers={"x-request-id": bad})
        assert answer.headers["x-request-id"] not in (bad, "") and len(answer.headers["x-request-id"]) == 32
    for path in ("/health", "/no/such/route", "/v1/responses/resp_missing"):  # errors and probes too
        answer = httpx.get(server.base_url + path)
        assert len(answer.headers["x-request-id"]) == 32, path
        assert access_line(logs, answer.headers["x-request-id"])["status"] == answer.status_code
    assert len({r.request_id for r in logs.records if r.name == "harmony_proxy.access"}) == 7


def test_a_client_that_leaves_is_flagged_and_every_line_about_it_has_its_id(
    serve: Callable[..., LiveServer], logs: pytest.LogCaptureFixture
) -> None:
    server = serve(completions=[LONG], token_delay=0.005)
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=10, headers={"x-request-id": "gone-1"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}) as left:
        lines = left.iter_lines()
        while '"content":"word' not in next(lines):
            pass
    line = access_line(logs, "gone-1")
    assert line["client_left"] is True and line["finish_reason"] == "abort" and line["status"] == 200
    assert 0 < line["completion_tokens"] < 600
    about = [r for r in logs.records if "stopped after" in r.getMessage()]  # generation.py's line on the abort
    assert about and all(r.request_id == "gone-1" for r in about)


def test_no_prompt_or_key_in_the_logs_by_default_and_the_prompt_with_log_requests(
    serve: Callable[..., LiveServer], logs: pytest.LogCaptureFixture
) -> None:
    quiet = serve(completions=[ANSWER], api_key=KEY)
    telling = serve(completions=[ANSWER], api_key=KEY, log_requests=True)
    for server in (quiet, telling):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}])
        client.responses.create(model=MODEL, input=PROMPT)
        with pytest.raises(openai.AuthenticationError):  # a wrong key is not logged either
            openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY + "-wrong", max_retries=0).models.list()
        if server is quiet:
            eventually(lambda: sum(r.name == "harmony_proxy.access" for r in logs.records) >= 3, still=quiet.running)
            logged = everything_logged(logs)
            assert PROMPT not in logged and KEY not in logged
            logs.clear()
    eventually(lambda: sum(r.name == "harmony_proxy.access" for r in logs.records) >= 3, still=telling.running)
    bodies = [r for r in logs.records if r.name == "harmony_proxy.requests"]
    assert len(bodies) == 2 and all(PROMPT in r.fields["body"] for r in bodies)  # type: ignore[attr-defined]
    assert all("authorization" not in r.fields["headers"] for r in bodies)  # type: ignore[attr-defined]
    assert all(r.request_id for r in bodies)
    assert KEY not in everything_logged(logs)


def test_json_log_format_writes_every_line_as_one_object(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": ANSWER}) + "\n")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--engine", "scripted", "--script", str(script), "--port", str(port),
         "--log-format", "json", "--log-requests", "--api-key", KEY, "--store-path", str(tmp_path / "s.sqlite3")],
        env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_healthy(port, process)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
        reply = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], extra_headers={"x-request-id": "json-1"})
        usage = reply.parse().usage
        time.sleep(0.2)
    finally:
        output = stop(process)
    entries = [json.loads(line) for line in output.splitlines() if line.strip()]  # raises on any line not JSON
    assert any(e["message"].startswith("event loop ") for e in entries)
    assert any("Uvicorn running on" in e["message"] for e in entries)  # uvicorn's lines too
    access = [e for e in entries if e["logger"] == "harmony_proxy.access" and e.get("request_id") == "json-1"]
    assert len(access) == 1
    assert access[0]["status"] == 200 and access[0]["completion_tokens"] == usage.completion_tokens
    assert access[0]["prompt_tokens"] == usage.prompt_tokens and access[0]["model"] == MODEL
    body = [e for e in entries if e["logger"] == "harmony_proxy.requests" and e.get("request_id") == "json-1"]
    assert len(body) == 1 and PROMPT in body[0]["body"] and "authorization" not in body[0]["headers"]
    assert KEY not in output
    assert not any(e["logger"] == "uvicorn.access" for e in entries)  # ours replaces uvicorn's access log


def test_control_characters_in_a_path_cannot_forge_a_line(serve: Callable[..., LiveServer],
                                                          logs: pytest.LogCaptureFixture) -> None:
    server = serve()
    forged = "INFO harmony_proxy.access: POST /v1/chat/completions 200"
    response = httpx.get(server.base_url + "/v1/x%0a" + forged.replace(" ", "%20") + "%00%0d%1b[31m", timeout=10)
    assert response.status_code == 404
    request_id = response.headers["x-request-id"]
    fields = access_line(logs, request_id)
    assert "\n" in fields["path"]  # the field holds what was asked; the text line shows it escaped
    record = next(r for r in logs.records if r.name == "harmony_proxy.access" and r.request_id == request_id)
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x00" not in line and "\r" not in line and "\x1b" not in line
    assert "/v1/x\\n" + forged + "\\x00\\r\\x1b[31m" in line
    assert "\\u0000" in JsonFormatter().format(record)  # JSON lines escape them as JSON does
