"""Hostile ids through the real server, on both stores: the same list of requests gets the same answers from a
server on SQLite and one on PostgreSQL, each a clear 400 or 404 in OpenAI's shape and never a 500 (issue 26, 4).

An id a client sends (in a path, a query, or the body) is checked where it enters (`proxy/ids.py`): one with a
control character (a NUL included, which PostgreSQL's text cannot hold), or longer than MAX_ID_LENGTH, is a 400
naming where it was; an input item whose id is such is refused before anything is generated."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.ids import MAX_ID_LENGTH
from proxy.store.base import StoredResponse, Unstorable
from proxy.store.postgres import PostgresResponseStore
from tests.conftest import MODEL
from tests.test_store_processes import ServerProcess

LONG = "x" * (MAX_ID_LENGTH + 1)
NUL = "msg_\u0000"


def _message(item_id: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": "hi", "id": item_id}


def _cases(response: str, conversation: str, item: str) -> list[tuple[str, str, str, Any, int, str | None]]:
    """(name, method, path, JSON body, status, param); paths are sent as written (%00 is a NUL once decoded)."""
    create = "/v1/responses"
    return [
        ("get %00", "GET", "/v1/responses/resp_%00", None, 400, "response_id"),
        ("get %00 streamed", "GET", "/v1/responses/resp_%00?stream=true", None, 400, "response_id"),
        ("get long", "GET", f"/v1/responses/{LONG}", None, 400, "response_id"),
        ("get control", "GET", "/v1/responses/resp_%0A%1B", None, 400, "response_id"),
        ("get surrogate bytes", "GET", "/v1/responses/resp_%ED%A0%80", None, 404, "response_id"),
        ("input items %00", "GET", "/v1/responses/resp_%00/input_items", None, 400, "response_id"),
        ("input items after=%00", "GET", f"/v1/responses/{response}/input_items?after=msg_%00", None, 400, "after"),
        ("input items after long", "GET", f"/v1/responses/{response}/input_items?after={LONG}", None, 400, "after"),
        ("delete %00", "DELETE", "/v1/responses/resp_%00", None, 400, "response_id"),
        ("cancel %00", "POST", "/v1/responses/resp_%00/cancel", None, 400, "response_id"),
        ("previous_response_id NUL", "POST", create,
         {"model": MODEL, "input": "hi", "previous_response_id": "resp_\u0000"}, 400, "previous_response_id"),
        ("previous_response_id long", "POST", create,
         {"model": MODEL, "input": "hi", "previous_response_id": LONG}, 400, "previous_response_id"),
        ("previous_response_id lone surrogate", "POST", create,
         {"model": MODEL, "input": "hi", "previous_response_id": "resp_\ud800"}, 400, "previous_response_id"),
        ("previous_response_id unknown", "POST", create,
         {"model": MODEL, "input": "hi", "previous_response_id": "resp_nothing"}, 404, "previous_response_id"),
        ("conversation NUL", "POST", create, {"model": MODEL, "input": "hi", "conversation": "conv_\u0000"},
         400, "conversation"),
        ("conversation object NUL", "POST", create,
         {"model": MODEL, "input": "hi", "conversation": {"id": "conv_\u0000"}}, 400, "conversation.id"),
        ("item_reference NUL", "POST", create,
         {"model": MODEL, "input": [{"type": "item_reference", "id": NUL}]}, 400, "input[0].id"),
        ("item_reference unknown", "POST", create,
         {"model": MODEL, "input": [{"type": "item_reference", "id": "msg_nothing"}]}, 404, "input[0].id"),
        ("input item id NUL", "POST", create, {"model": MODEL, "input": [_message(NUL)]}, 400, "input[0].id"),
        ("input item id long", "POST", create, {"model": MODEL, "input": [_message(LONG)]}, 400, "input[0].id"),
        ("background input item id NUL", "POST", create,
         {"model": MODEL, "background": True, "input": [_message(NUL)]}, 400, "input[0].id"),
        ("input_tokens previous NUL", "POST", "/v1/responses/input_tokens",
         {"model": MODEL, "input": "hi", "previous_response_id": "resp_\u0000"}, 400, "previous_response_id"),
        ("input_tokens item id NUL", "POST", "/v1/responses/input_tokens",
         {"model": MODEL, "input": [_message(NUL)]}, 400, "input[0].id"),
        ("get conversation %00", "GET", "/v1/conversations/conv_%00", None, 400, "conversation_id"),
        ("update conversation %00", "POST", "/v1/conversations/conv_%00", {"metadata": {}}, 400, "conversation_id"),
        ("delete conversation %00", "DELETE", "/v1/conversations/conv_%00", None, 400, "conversation_id"),
        ("conversation items %00", "GET", "/v1/conversations/conv_%00/items", None, 400, "conversation_id"),
        ("conversation items after=%00", "GET", f"/v1/conversations/{conversation}/items?after=msg_%00", None,
         400, "after"),
        ("conversation item %00", "GET", f"/v1/conversations/{conversation}/items/msg_%00", None, 400, "item_id"),
        ("conversation item long", "GET", f"/v1/conversations/{conversation}/items/{LONG}", None, 400, "item_id"),
        ("delete conversation item %00", "DELETE", f"/v1/conversations/{conversation}/items/msg_%00", None, 400,
         "item_id"),
        ("conversation item unknown", "GET", f"/v1/conversations/{conversation}/items/msg_nothing", None, 404,
         None),
        ("create conversation item id NUL", "POST", "/v1/conversations", {"items": [_message(NUL)]}, 400,
         "items[0].id"),
        ("add item id NUL", "POST", f"/v1/conversations/{conversation}/items", {"items": [_message(NUL)]}, 400,
         "items[0].id"),
        ("add item id long", "POST", f"/v1/conversations/{conversation}/items", {"items": [_message(LONG)]}, 400,
         "items[0].id"),
        ("add to conversation %00", "POST", "/v1/conversations/conv_%00/items", {"items": [_message("msg_1")]},
         400, "conversation_id"),
        ("add item_reference NUL", "POST", f"/v1/conversations/{conversation}/items",
         {"items": [{"type": "item_reference", "id": NUL}]}, 400, "items[0].id"),
        ("compact previous NUL", "POST", "/v1/responses/compact",
         {"model": MODEL, "input": "hi", "previous_response_id": "resp_\u0000"}, 400, "previous_response_id"),
        ("compact item id NUL", "POST", "/v1/responses/compact", {"model": MODEL, "input": [_message(NUL)]}, 400,
         "input[0].id"),
    ]


def _generated_tokens(server: ServerProcess) -> float:
    text = server.request("GET", "/metrics").text
    found = re.findall(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return sum(float(value) for value in found)


def _answers(server: ServerProcess) -> dict[str, tuple[int, Any]]:
    response = server.create(input="first", max_output_tokens=16)
    conversation = server.request("POST", "/v1/conversations", json={"items": [_message("msg_1")]}).json()
    before = _generated_tokens(server)
    answers = {}
    for name, method, path, body, _, _ in _cases(response["id"], conversation["id"], "msg_1"):
        sent = None if body is None else json.dumps(body)  # \u escapes: a lone surrogate included
        answer = server.request(method, path, content=sent, headers={"content-type": "application/json"})
        error = answer.json().get("error") if answer.status_code >= 400 else None
        answers[name] = (answer.status_code, error and {"param": error["param"], "type": error["type"]})
    answers["tokens generated by refused requests"] = (0, _generated_tokens(server) - before)
    return answers


@pytest.fixture
def both(tmp_path: Path, postgres_url: str) -> Any:
    servers = []
    try:
        for store in (tmp_path / "store.sqlite3", postgres_url):
            servers.append(ServerProcess(None, store, tmp_path / f"server{len(servers)}.log"))
        yield servers
    finally:
        for server in servers:
            server.stop()


def test_hostile_ids_get_the_same_answers_on_both_stores(both: list[ServerProcess]) -> None:
    sqlite, postgres = (_answers(server) for server in both)
    expected = {name: (status, {"param": param, "type": "invalid_request_error"} if param or status == 400 else None)
                for name, _, _, _, status, param in _cases("", "", "")}
    expected["tokens generated by refused requests"] = (0, 0.0)
    for name, (status, error) in expected.items():
        if status == 404:  # not found: the param named, the type OpenAI's for a 404
            assert sqlite[name][0] == 404, (name, sqlite[name])
            expected[name] = sqlite[name]
    for name in expected:
        print(f"{name:40} sqlite {sqlite[name]}  postgres {postgres[name]}")
    assert sqlite == expected
    assert postgres == sqlite
    for server in both:
        assert "Traceback" not in server.log_text(), server.log_text()


def test_postgres_refuses_what_it_cannot_hold(postgres_url: str) -> None:
    """Past the checks at the door, the store still answers a NUL with Unstorable (a 400), not a driver error."""

    async def scenario() -> None:
        store = PostgresResponseStore(postgres_url)
        await store.open()
        try:
            resource = {"id": "resp_1", "status": "completed", "created_at": 1, "output": []}
            with pytest.raises(Unstorable):
                await store.save(StoredResponse(resource, [_message(NUL)]))
            with pytest.raises(Unstorable):
                await store.load("resp_\u0000")
            assert await store.load("resp_1") is None  # the save was one transaction: nothing of it stayed
        finally:
            await store.close()

    asyncio.run(scenario())
