"""Requests built to break the server get clear 4xx answers, promptly, and leave it serving."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server(serve: Callable[..., LiveServer]) -> Iterator[LiveServer]:
    live = serve()  # the mock engine: it also reads and echoes what it is sent
    yield live
    assert httpx.get(live.base_url + "/health", timeout=10).status_code == 200  # still serving afterwards


def post(server: LiveServer, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(server.base_url + path, content=content, timeout=30,
                      headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (CHAT, b'{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"hi"}],"temperature":NaN}'),
        (CHAT, b'{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"hi"}],"max_tokens":Infinity}'),
        ("/v1/responses", b'{"model":"openai/gpt-oss-20b","input":"hi","temperature":NaN}'),
        (CHAT, b'{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"\\ud800"}]}'),
        (CHAT, b'{"model":"\\udfff","messages":[{"role":"user","content":"hi"}]}'),
        ("/v1/responses", b'{"model":"openai/gpt-oss-20b","input":"hi","user":"\\ud800","stream":true}'),
        ("/v1/completions", b'{"model":"openai/gpt-oss-20b","prompt":"\\ud800"}'),
        (CHAT, b"[" * 100_000 + b"]" * 100_000),
        (CHAT, b'{"model":"openai/gpt-oss-20b","messages":' + b"[" * 80 + b"]" * 80 + b"}"),
    ],
)
def test_json_that_is_not_sound_is_a_400(server: LiveServer, path: str, raw: bytes) -> None:
    response = post(server, path, raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"


def test_valid_surrogate_pairs_are_fine(server: LiveServer) -> None:
    body = b'{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"\\ud83e\\uddea"}]}'
    response = post(server, CHAT, body)
    assert response.status_code == 200 and "\U0001f9ea" in response.json()["choices"][0]["message"]["content"]


def test_oversized_bodies_are_refused_before_they_are_read(server: LiveServer) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # declares 9 MiB, sends 2 bytes
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 9437184\r\n\r\n{}")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")  # answered at once, not after reading 9 MiB

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield b'{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"'
        for _ in range(9):
            yield b"x" * (1024 * 1024)
        yield b'"}]}'

    response = httpx.post(server.base_url + CHAT, content=chunks(), timeout=30)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": [*HI, {"role": "assistant", "content": [{"type": "text", "text": 5}]}, *HI]},
         "messages[1].content[0].text"),
        (CHAT, {"messages": [*HI, {"role": "assistant", "content": [{"type": "refusal", "refusal": {"a": 1}}]}, *HI]},
         "messages[1].content[0].refusal"),
        ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
         "input[0].content[0].text"),
        ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                     {"type": "function_call_output", "call_id": "c",
                                      "output": [{"type": "input_text", "text": None}]}]}, "input[1].output[0].text"),
        ("/v1/responses", {"input": [1]}, "input[0]"),
        ("/v1/responses", {"input": [{"type": ["message"]}]}, "input[0].type"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": [10**9]}, "prompt"),
        ("/v1/completions", {"prompt": [201089]}, "prompt"),
        ("/v1/completions", {"prompt": [10**30]}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "stop_token_ids": [10**30]}, "stop_token_ids"),
        (CHAT, {"messages": HI, "stop": ["s"] * 17}, "stop"),
        (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": json.loads('{"type":"object","properties":{"a":' * 25 + "{}" + "}}" * 25)}}]},
         "tools[0].function.parameters"),
        (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "description": "x" * 5000}}]},
         "tools[0].function.description"),
    ],
)
def test_values_of_the_wrong_kind_are_400s_naming_them(server: LiveServer, path: str, body: dict[str, Any],
                                                      param: str) -> None:
    response = httpx.post(server.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_hostile_tool_schemas_do_not_stall_the_mock(server: LiveServer) -> None:
    for schema in ({"type": "object", "properties": {"a": {"type": "string", "minLength": 10**9}}, "required": ["a"]},
                   {"type": "object", "properties": {"a": {"type": "array", "minItems": 10**8}}, "required": ["a"]},
                   {"$ref": "#"}):
        started = time.process_time()  # CPU time (the server runs in this process): load does not stretch it
        body = {"model": MODEL, "messages": [{"role": "user", "content": "call f"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
        response = httpx.post(server.base_url + CHAT, json=body, timeout=30)
        assert response.status_code == 200 and time.process_time() - started < 5
        assert response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"


def test_long_unbroken_text_is_handled_quickly(server: LiveServer) -> None:
    for size, status in ((400_000, 200), (4_000_000, 400)):  # the second is longer than the context window
        started = time.monotonic()
        response = httpx.post(server.base_url + CHAT, timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "x" * size}], "max_tokens": 200})
        assert response.status_code == status and time.monotonic() - started < 10  # minutes when quadratic


def test_many_item_references(server: LiveServer) -> None:
    refs = [{"type": "item_reference", "id": f"msg_{n}"} for n in range(5000)]
    response = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, "input": refs}, timeout=30)
    assert response.status_code == 404 and response.json()["error"]["code"] == "item_not_found"


def test_background_needs_storage(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], store_path=None)
    response = httpx.post(server.base_url + "/v1/responses", timeout=30,
                          json={"model": MODEL, "input": "hi", "background": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "background"


def test_api_key_covers_tokenize(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], api_key="sk-local")
    body = {"model": MODEL, "messages": HI}
    assert httpx.post(server.base_url + "/tokenize", json=body, timeout=30).status_code == 401
    authorized = httpx.post(server.base_url + "/tokenize", json=body, timeout=30,
                            headers={"authorization": "Bearer sk-local"})
    assert authorized.status_code == 200


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
def test_usage_is_the_same_streamed_or_not_when_a_stop_string_ends_the_first_step(
    serve: Callable[..., LiveServer], path: str
) -> None:
    server = serve(completions=["Stop right here.<|return|>"])
    if path == CHAT:
        body: dict[str, Any] = {"model": MODEL, "messages": HI, "stop": ["Stop"]}
    else:
        body = {"model": MODEL, "prompt": [1], "stop": ["Stop"], "max_tokens": 50}
    plain = httpx.post(server.base_url + path, json=body, timeout=30).json()["usage"]
    streamed = httpx.post(server.base_url + path, timeout=30,
                          json={**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert [chunk["usage"] for chunk in chunks if chunk.get("usage")] == [plain]


SURROGATE = b"\xed\xa0\x80"  # a lone surrogate written as raw bytes: not UTF-8
FN = {"type": "function", "name": "f", "description": "DESCRIPTION", "parameters": {"type": "object"}}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/responses", {"input": "hi", "metadata": {"k": "BAD"}}, "metadata.k"),
        ("/v1/responses", {"input": "hi", "instructions": "BAD"}, "instructions"),
        ("/v1/responses", {"input": "hi", "tools": [{**FN, "description": "BAD"}]}, "tools[0].description"),
        ("/v1/responses", {"input": "BAD", "stream": True}, "input"),
        ("/v1/responses", {"input": "BAD", "background": True}, "input"),
        ("/v1/responses", {"input": [{"role": "user", "content": "BAD"}], "store": True}, "input[0].content"),
        (CHAT, {"messages": [{"role": "user", "content": "BAD"}]}, "messages[0].content"),
        (CHAT, {"messages": HI, "stream": True, "user": "BAD"}, "user"),
        ("/v1/completions", {"prompt": "BAD"}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": "BAD"}]}, "messages[0].content"),
    ],
)
@pytest.mark.parametrize("bad", [SURROGATE, b"\xff", b"\\udc00"])
def test_text_that_is_not_utf8_is_a_400_naming_the_field_and_nothing_is_stored(
    serve: Callable[..., LiveServer], tmp_path: Any, path: str, body: dict[str, Any], param: str, bad: bytes
) -> None:
    import sqlite3

    live = serve(store_path=tmp_path / "store.sqlite3")
    raw = json.dumps({"model": MODEL, **body}).encode().replace(b"BAD", b"a" + bad + b"b")
    response = post(live, path, raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert response.json()["error"]["code"] == "invalid_json"
    time.sleep(0.2)  # a background job, had one started, would have saved by now
    with sqlite3.connect(tmp_path / "store.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM responses").fetchone() == (0,)


def test_a_bad_key_is_named_too(server: LiveServer) -> None:
    raw = b'{"model":"openai/gpt-oss-20b","input":"hi","metadata":{"a' + SURROGATE + b'":"x"}}'
    response = post(server, "/v1/responses", raw)
    assert response.status_code == 400 and response.json()["error"]["param"].startswith("metadata.a")


def test_a_stored_lone_surrogate_cannot_fail_a_get(serve: Callable[..., LiveServer], tmp_path: Any) -> None:
    """Saved before such text was refused: it reads back as U+FFFD rather than a 500 on every GET."""
    import asyncio

    from proxy.store.base import StoredResponse
    from proxy.store.sqlite import SQLiteResponseStore

    path = tmp_path / "old.sqlite3"
    resource = {"id": "resp_old", "object": "response", "created_at": 1, "status": "completed", "model": MODEL,
                "metadata": {"k": "a\ud800b"}, "instructions": "\udfff",
                "output": [{"id": "msg_old", "type": "message", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "hi \U0001f9ea\ud83e", "annotations": []}]}]}
    item = {"id": "in_old", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "\ud800"}]}

    async def save() -> None:
        store = SQLiteResponseStore(path)
        await store.save(StoredResponse(resource, [item]))
        await store.close()

    asyncio.run(save())
    live = serve(store_path=path)
    got = httpx.get(live.base_url + "/v1/responses/resp_old", timeout=10)
    assert got.status_code == 200, got.text
    assert got.json()["metadata"] == {"k": "a\ufffdb"}
    assert got.json()["output"][0]["content"][0]["text"] == "hi \U0001f9ea\ufffd"
    items = httpx.get(live.base_url + "/v1/responses/resp_old/input_items", timeout=10)
    assert items.status_code == 200 and items.json()["data"][0]["content"][0]["text"] == "\ufffd"
    again = httpx.post(live.base_url + "/v1/responses", timeout=30,
                       json={"model": MODEL, "input": "more", "previous_response_id": "resp_old"})
    assert again.status_code == 200, again.text


@pytest.mark.parametrize("path", [CHAT, "/v1/responses"])
@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({f"k{n}": "v" for n in range(17)}, "metadata"),  # OpenAI's limits: 16 pairs,
        ({"k" * 65: "v"}, "metadata"),  # keys of at most 64 characters,
        ({"k": "v" * 513}, "metadata.k"),  # values of at most 512
        ({"k": "v" * 4_700_000}, "metadata.k"),  # a 4.7 MB value: the error quotes ~100 characters of it
    ],
)
def test_metadata_has_openais_limits_and_errors_quote_little(server: LiveServer, path: str,
                                                              metadata: dict[str, str], param: str) -> None:
    body = {"model": MODEL, "metadata": metadata, **({"messages": HI} if path == CHAT else {"input": "hi"})}
    response = httpx.post(server.base_url + path, json=body, timeout=30)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == param
    assert len(response.content) < 600


@pytest.mark.parametrize("path", [CHAT, "/v1/responses"])
def test_metadata_at_the_limits_is_fine(server: LiveServer, path: str) -> None:
    metadata = {f"{n:02d}" + "k" * 62: "v" * 512 for n in range(16)}
    body = {"model": MODEL, "metadata": metadata, **({"messages": HI} if path == CHAT else {"input": "hi"})}
    assert httpx.post(server.base_url + path, json=body, timeout=30).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"model": "m" * 4_000_000, "messages": HI}),
        (CHAT, {"messages": HI, "reasoning_effort": "e" * 4_000_000}),
        (CHAT, {"messages": HI, "x" * 4_000_000: 1}),
        ("/v1/responses", {"input": "hi", "truncation": ["auto"] * 1_000_000}),
        ("/v1/responses", {"input": "hi", "model": {"k" * 1_000_000: 1}}),
    ],
)
def test_an_error_quotes_a_bounded_part_of_the_value(server: LiveServer, path: str, body: dict[str, Any]) -> None:
    response = httpx.post(server.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert 400 <= response.status_code < 500, response.text[:300]
    assert len(response.content) < 1000, response.text[:300]


RESPONSES_ROUTES = ["/v1/responses", "/v1/responses/input_tokens", "/v1/responses/compact"]
_TYPED_BADLY = [
    ({"tools": [{"type": {}}]}, "tools[0].type"),
    ({"tools": [{"type": ["function"], "name": "f"}]}, "tools[0].type"),
    ({"tools": [{"type": None}]}, "tools[0].type"),
]


@pytest.mark.parametrize(("extra", "param"), _TYPED_BADLY)
@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
def test_a_type_that_is_not_a_string_is_a_400_on_chat(server: LiveServer, path: str, extra: dict[str, Any],
                                                      param: str) -> None:
    response = httpx.post(server.base_url + path, json={"model": MODEL, "messages": HI, **extra}, timeout=30)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        *_TYPED_BADLY,
        ({"tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": {}}]}]},
         "tools[0].tools[0].type"),
        ({"input": [{"type": "additional_tools", "role": "developer", "tools": [{"type": {}}]},
                    {"role": "user", "content": "hi"}]}, "input[0].tools[0].type"),
        ({"input": [{"type": "code_interpreter_call", "id": "ci_1", "code": "1",
                     "outputs": [{"type": "logs", "logs": {}}]}, {"role": "user", "content": "hi"}]},
         "input[0].outputs[0].logs"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [{"role": "assistant", "content": [{"type": "output_text"}]}, {"role": "user", "content": "hi"}]},
         "input[0].content[0].text"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}]}]},
         "input[1].output[0].text"),
    ],
)
@pytest.mark.parametrize("path", RESPONSES_ROUTES)
def test_malformed_tools_and_items_are_400s_on_every_responses_route(server: LiveServer, path: str,
                                                                      extra: dict[str, Any], param: str) -> None:
    """Each of these was a TypeError in a parser that trusted a type (a 500); a text part without its text was
    accepted, and compact echoed it back."""
    response = httpx.post(server.base_url + path, json={"model": MODEL, "input": "hi", **extra}, timeout=30)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == param


def test_compact_requires_a_model_as_openai(server: LiveServer) -> None:
    response = httpx.post(server.base_url + "/v1/responses/compact", json={"input": "hi"}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"
    assert response.json()["error"]["code"] == "missing_required_parameter"
    counted = httpx.post(server.base_url + "/v1/responses/input_tokens", json={"input": "hi"}, timeout=30)
    assert counted.status_code == 200  # optional there: the served model
