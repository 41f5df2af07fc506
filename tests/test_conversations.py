"""The Conversations API against the real server: the openai SDK's own calls and strict types, `conversation`
on POST /v1/responses (streamed, not, and in the background), openai-agents' OpenAIConversationsSession, and a
server killed with SIGKILL that keeps every acknowledged item."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.memory import OpenAIConversationsSession
from openai import AsyncOpenAI
from openai.types.conversations import Conversation, ConversationDeletedResource, ConversationItemList
from openai.types.conversations.conversation_item import ConversationItem
from pydantic import TypeAdapter

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.open_responses import validate_resource
from tests.test_e2e_chat import ANSWER, client_for
from tests.test_store_processes import ServerProcess

set_tracing_disabled(True)
ITEM = TypeAdapter(ConversationItem)


def raw(server: LiveServer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, server.base_url + path, timeout=30, **kwargs)


def strict(body: dict[str, Any], kind: Any) -> None:
    kind.model_validate(body, strict=True)
    for item in body.get("data") or []:
        ITEM.validate_python(item, strict=True)


def texts(items: list[Any]) -> list[str]:
    return [part.text for item in items if item.type == "message" for part in item.content]


def test_conversation_objects_and_items(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER])
    client = client_for(server)
    created = client.conversations.create(metadata={"topic": "weather"},
                                          items=[{"role": "user", "content": "one"},
                                                 {"type": "message", "role": "assistant", "content": "two"}])
    assert created.id.startswith("conv_") and created.metadata == {"topic": "weather"}
    body = raw(server, "GET", f"/v1/conversations/{created.id}").json()
    strict(body, Conversation)
    assert body == created.model_dump()
    assert client.conversations.update(created.id, metadata={"topic": "rain"}).metadata == {"topic": "rain"}
    assert client.conversations.retrieve(created.id).metadata == {"topic": "rain"}

    added = client.conversations.items.create(created.id, items=[{"role": "user", "content": f"m{n}"}
                                                                 for n in range(3, 6)])
    strict(added.model_dump(mode="json"), ConversationItemList)
    assert texts(added.data) == ["m3", "m4", "m5"] and added.has_more is False
    listed = raw(server, "GET", f"/v1/conversations/{created.id}/items", params={"order": "asc"}).json()
    strict(listed, ConversationItemList)
    assert [item["content"][0]["text"] for item in listed["data"]] == ["one", "two", "m3", "m4", "m5"]
    assert listed["data"][1]["content"][0]["type"] == "output_text" and listed["data"][1]["status"] == "completed"
    newest = client.conversations.items.list(created.id, limit=2)  # desc by default
    assert texts(newest.data) == ["m5", "m4"] and newest.has_more
    assert texts(list(client.conversations.items.list(created.id, limit=2))) == ["m5", "m4", "m3", "two", "one"]
    assert texts(list(client.conversations.items.list(created.id, order="asc", limit=2,
                                                      after=listed["data"][1]["id"]))) == ["m3", "m4", "m5"]

    third = listed["data"][2]
    assert client.conversations.items.retrieve(third["id"], conversation_id=created.id).model_dump(
        mode="json", exclude_unset=True) == third
    assert client.conversations.items.delete(third["id"], conversation_id=created.id).id == created.id
    assert texts(list(client.conversations.items.list(created.id, order="asc"))) == ["one", "two", "m4", "m5"]

    for method, path, kwargs, status, param in [
        ("GET", f"/v1/conversations/{created.id}/items/{third['id']}", {}, 404, "item_id"),
        ("DELETE", f"/v1/conversations/{created.id}/items/{third['id']}", {}, 404, "item_id"),
        ("GET", "/v1/conversations/conv_missing", {}, 404, "conversation"),
        ("GET", "/v1/conversations/conv_missing/items", {}, 404, "conversation"),
        ("POST", "/v1/conversations/conv_missing/items", {"json": {"items": [{"role": "user", "content": "x"}]}},
         404, "conversation"),
        ("GET", f"/v1/conversations/{created.id}/items", {"params": {"after": "msg_nope"}}, 400, "after"),
        ("GET", f"/v1/conversations/{created.id}/items", {"params": {"limit": "101"}}, 400, "limit"),
        ("GET", f"/v1/conversations/{created.id}/items", {"params": {"include": "nonsense"}}, 400, "include[0]"),
        ("POST", "/v1/conversations", {"json": {"items": [{"role": "user", "content": "x"}] * 21}}, 400, "items"),
        ("POST", "/v1/conversations", {"json": {"metadata": {"k" * 65: "v"}}}, 400, "metadata"),
        ("POST", "/v1/conversations", {"json": {"items": [{"type": "nonsense"}]}}, 400, "items[0].type"),
        ("POST", f"/v1/conversations/{created.id}", {"json": {}}, 400, "metadata"),
        ("POST", f"/v1/conversations/{created.id}/items",  # already in the conversation: nothing is added
         {"json": {"items": [{"role": "user", "content": "new"}, listed["data"][0]]}}, 400, "items[1]"),
        ("POST", f"/v1/conversations/{created.id}/items",
         {"json": {"items": [{"id": "msg_twice", "role": "user", "content": "a"},
                             {"id": "msg_twice", "role": "user", "content": "b"}]}}, 400, "items[1]"),
    ]:
        response = raw(server, method, path, **kwargs)
        assert response.status_code == status, (path, response.text)
        assert response.json()["error"]["param"] == param, response.text
    assert texts(list(client.conversations.items.list(created.id, order="asc"))) == ["one", "two", "m4", "m5"]

    deleted = raw(server, "DELETE", f"/v1/conversations/{created.id}").json()
    strict(deleted, ConversationDeletedResource)
    assert deleted == {"id": created.id, "object": "conversation.deleted", "deleted": True}
    assert raw(server, "GET", f"/v1/conversations/{created.id}/items").status_code == 404


@pytest.mark.parametrize("mode", ["plain", "streamed", "background"])
def test_responses_in_a_conversation(serve: Callable[..., LiveServer], vocab: Any, mode: str) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER]))
    server = serve(engine=engine)
    client = client_for(server)
    conversation = client.conversations.create(items=[{"role": "user", "content": "I am in Paris."}])

    def create(text: str) -> Any:
        if mode == "streamed":
            with client.responses.stream(model=MODEL, input=text, conversation=conversation.id) as stream:
                return stream.get_final_response()
        response = client.responses.create(model=MODEL, input=text, conversation={"id": conversation.id},
                                           background=mode == "background")
        while response.status in ("queued", "in_progress"):
            time.sleep(0.02)
            response = client.responses.retrieve(response.id)
        return response

    first = create("Weather?")
    assert first.status == "completed" and first.conversation.id == conversation.id
    validate_resource(first.model_dump(mode="json", exclude_unset=True))
    assert client.responses.retrieve(first.id).conversation.id == conversation.id
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert [item.type for item in items] == ["message", "message", "reasoning", "message"]
    assert [item.id for item in items[1:]] == [client.responses.input_items.list(first.id).data[0].id,
                                               *(item.id for item in first.output)]
    assert texts(items) == ["I am in Paris.", "Weather?", "It is 18C."]

    second = create("And tomorrow?")
    prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert prompt.index("I am in Paris.") < prompt.index("Weather?") < prompt.index("It is 18C.") \
        < prompt.index("And tomorrow?")
    assert second.previous_response_id is None
    assert texts(list(client.conversations.items.list(conversation.id, order="asc"))) == [
        "I am in Paris.", "Weather?", "It is 18C.", "And tomorrow?", "It is 18C."]


def test_conversation_parameter_is_checked(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER])
    client = client_for(server)
    conversation = client.conversations.create(items=[{"id": "msg_seen", "role": "user", "content": "hi"}])
    previous = client.responses.create(model=MODEL, input="hi")
    for body, status, param in [
        ({"conversation": conversation.id, "previous_response_id": previous.id}, 400, "conversation"),
        ({"conversation": conversation.id, "store": False}, 400, "store"),
        ({"conversation": "conv_missing"}, 404, "conversation"),
        ({"conversation": {"id": 3}}, 400, "conversation.id"),
        ({"conversation": conversation.id, "input": [{"id": "msg_seen", "role": "user", "content": "hi"}]},
         400, "input[0]"),
    ]:
        response = raw(server, "POST", "/v1/responses", json={"model": MODEL, "input": "hi", **body})
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["param"] == param, response.text
    assert len(list(client.conversations.items.list(conversation.id))) == 1  # nothing was added
    with pytest.raises(openai.BadRequestError):
        client_for(serve(completions=[ANSWER], store_path=None)).conversations.create()


def test_agents_conversations_session(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """OpenAIConversationsSession keeps the history in the server's conversation; Runner's `conversation_id`
    has the server add each turn itself."""
    engine = Recording(scripted_engine(vocab, [ANSWER] * 4))
    server = serve(engine=engine)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    agent = Agent(name="weather", instructions="Answer briefly.",
                  model=OpenAIResponsesModel(model=MODEL, openai_client=client))

    async def run() -> tuple[list[Any], list[Any], str]:
        session = OpenAIConversationsSession(openai_client=client)
        assert (await Runner.run(agent, "I am in Paris.", session=session)).final_output == "It is 18C."
        assert (await Runner.run(agent, "Weather?", session=session)).final_output == "It is 18C."
        kept = await session.get_items()
        popped = await session.pop_item()
        assert popped is not None and popped["content"][0]["text"] == "It is 18C."
        assert len(await session.get_items()) == len(kept) - 1
        await session.clear_session()

        conversation = await client.conversations.create()
        for text in ("I am in Rome.", "Weather?"):
            result = await Runner.run(agent, text, conversation_id=conversation.id)
            assert result.final_output == "It is 18C."
        server_kept = [item async for item in client.conversations.items.list(conversation.id, order="asc")]
        return kept, server_kept, session.session_id if session._session_id else ""

    kept, server_kept, left = asyncio.run(run())
    assert [item.get("role") for item in kept if item.get("type", "message") == "message"] == [
        "user", "assistant", "user", "assistant"]
    assert left == ""  # cleared: the conversation was deleted
    second = vocab.decode(engine.requests[1].prompt_token_ids)
    assert second.index("I am in Paris.") < second.index("It is 18C.") < second.index("Weather?")
    fourth = vocab.decode(engine.requests[3].prompt_token_ids)
    assert fourth.index("I am in Rome.") < fourth.index("It is 18C.") < fourth.index("Weather?")
    assert "Paris" not in fourth
    assert texts(server_kept) == ["I am in Rome.", "It is 18C.", "Weather?", "It is 18C."]


def test_acknowledged_items_survive_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": ANSWER}) + "\n", encoding="utf-8")
    store, log = tmp_path / "store.sqlite3", tmp_path / "server.log"
    server = ServerProcess(script, store, log)
    conversation = server.request("POST", "/v1/conversations", json={"metadata": {"a": "b"}}).json()
    path = f"/v1/conversations/{conversation['id']}/items"
    for n in range(20):
        assert server.request("POST", path, json={"items": [{"role": "user", "content": f"m{n}"}]}).status_code == 200
    answered = server.create(input="last", conversation=conversation["id"])
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=30)
    again = ServerProcess(script, store, log)
    try:
        assert again.request("GET", f"/v1/conversations/{conversation['id']}").json() == conversation
        items = again.request("GET", path, params={"order": "asc", "limit": 100}).json()["data"]
        assert [part["text"] for item in items if item["type"] == "message" for part in item["content"]] == [
            *(f"m{n}" for n in range(20)), "last", "It is 18C."]
        assert again.get(answered["id"]) == answered
    finally:
        again.stop()
