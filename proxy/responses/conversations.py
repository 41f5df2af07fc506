"""The Conversations API: conversations and their items, kept in the Responses store.

A conversation is an ordered list of items. Clients add items themselves (`POST .../items`, as openai-agents'
`OpenAIConversationsSession` does), or name the conversation in `POST /v1/responses`: its items come before the
request's input, and the response's input and output items are added to it when the response ends, in the same
store transaction as the response's final save (`proxy/store/base.py`).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import APIError, invalid_request
from proxy.ids import checked_id, new_id
from proxy.responses.request.input_items import normalize_items, refuse_duplicates
from proxy.responses.request.pages import page, page_query
from proxy.responses.request.parse import conversation_not_found, resolve_references
from proxy.responses.request.schema import INCLUDABLE
from proxy.state import ServerState
from proxy.store.base import DuplicateItem, ResponseStore
from proxy.validation import METADATA, check, compile_schema, read_json_object

MAX_ITEMS_PER_REQUEST = 20  # as OpenAI: "You may add up to 20 items at a time."

_ITEMS = {"type": "array", "maxItems": MAX_ITEMS_PER_REQUEST, "items": {"type": "object"}}
CREATE_REQUEST = {"type": "object", "additionalProperties": False,
                  "properties": {"items": {"anyOf": [{"type": "null"}, _ITEMS]}, "metadata": METADATA}}
UPDATE_REQUEST = {"type": "object", "additionalProperties": False, "required": ["metadata"],
                  "properties": {"metadata": METADATA}}
ADD_REQUEST = {"type": "object", "additionalProperties": False, "required": ["items"], "properties": {"items": _ITEMS}}
_CREATE, _UPDATE, _ADD = compile_schema(CREATE_REQUEST), compile_schema(UPDATE_REQUEST), compile_schema(ADD_REQUEST)


async def create_conversation(request: Request) -> Response:
    store = _store(request)
    body = await read_json_object(request)
    check(body, _CREATE)
    items = await _new_items(store, body.get("items") or [])
    conversation = {"id": new_id("conv_"), "object": "conversation", "created_at": int(time.time()),
                    "metadata": body.get("metadata") or {}}
    await store.create_conversation(conversation, items)
    return JSONResponse(conversation)


async def retrieve_conversation(request: Request) -> Response:
    store, conversation_id = _store(request), _conversation_id(request)
    return JSONResponse(_found(await store.load_conversation(conversation_id), conversation_id))


async def update_conversation(request: Request) -> Response:
    store, conversation_id = _store(request), _conversation_id(request)
    body = await read_json_object(request)
    check(body, _UPDATE)
    return JSONResponse(_found(await store.update_conversation(conversation_id, body["metadata"] or {}),
                               conversation_id))


async def delete_conversation(request: Request) -> Response:
    store, conversation_id = _store(request), _conversation_id(request)
    if not await store.delete_conversation(conversation_id):
        raise conversation_not_found(conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def add_items(request: Request) -> Response:
    store, conversation_id = _store(request), _conversation_id(request)
    _include(request)
    body = await read_json_object(request)
    check(body, _ADD)
    items = await _new_items(store, body["items"])
    try:
        added = await store.add_conversation_items(conversation_id, items)
    except DuplicateItem as exc:
        raise _duplicate(exc.item_id, items) from None
    if not added:
        raise conversation_not_found(conversation_id)
    return JSONResponse(page(items, has_more=False))


async def list_items(request: Request) -> Response:
    store, conversation_id = _store(request), _conversation_id(request)
    _include(request)
    asked = page_query(request.query_params)
    after, limit = asked.after, asked.limit
    if (after is not None and await store.conversation_item(conversation_id, after) is None
            and await store.load_conversation(conversation_id) is not None):
        raise invalid_request(f"No item with id '{after}' in this conversation.", param="after")
    items = await store.conversation_items(conversation_id, after, limit + 1, newest_first=asked.newest_first)
    if items is None:
        raise conversation_not_found(conversation_id)
    return JSONResponse(page(items[:limit], has_more=len(items) > limit))


async def retrieve_item(request: Request) -> Response:
    store, conversation_id, item_id = _store(request), *_item_path(request)
    _include(request)
    item = await store.conversation_item(conversation_id, item_id)
    if item is None:
        _found(await store.load_conversation(conversation_id), conversation_id)
        raise _item_not_found(item_id)
    return JSONResponse(item)


async def delete_item(request: Request) -> Response:
    """Answers with the conversation, as OpenAI does."""
    store, conversation_id, item_id = _store(request), *_item_path(request)
    conversation = _found(await store.load_conversation(conversation_id), conversation_id)
    if not await store.delete_conversation_item(conversation_id, item_id):
        raise _item_not_found(item_id)
    return JSONResponse(conversation)


def _store(request: Request) -> ResponseStore:
    state: ServerState = request.app.state.harmony
    if state.responses is None:
        raise invalid_request("Conversations need storage, which this server has off (--no-store).")
    return state.responses


async def _new_items(store: ResponseStore, raw: list[Any]) -> list[dict[str, Any]]:
    """Normalized, references resolved; an id twice is refused here, one already in the conversation by the store."""
    items = await resolve_references(normalize_items(raw, "items"), store, "items")
    refuse_duplicates([], items, "items")
    return items


def _include(request: Request) -> None:
    """`include` asks for extras of items this server never produces, or keeps as they were made: checked only."""
    for position, value in enumerate(request.query_params.getlist("include")):
        if value not in INCLUDABLE:
            raise invalid_request(f"`include` value {value!r} is not one of {INCLUDABLE}.",
                                  param=f"include[{position}]", code="invalid_value")


def _item_path(request: Request) -> tuple[str, str]:
    return _conversation_id(request), checked_id(request.path_params["item_id"], "item_id")


def _conversation_id(request: Request) -> str:
    return checked_id(request.path_params["conversation_id"], "conversation_id")


def _found(conversation: dict[str, Any] | None, conversation_id: str) -> dict[str, Any]:
    if conversation is None:
        raise conversation_not_found(conversation_id)
    return conversation


def _item_not_found(item_id: str) -> APIError:
    return APIError(404, f"Item with id '{item_id}' not found.", param="item_id", code="not_found")


def _duplicate(item_id: str, items: list[dict[str, Any]]) -> APIError:
    position = next(index for index, item in enumerate(items) if item["id"] == item_id)
    return invalid_request(f"Duplicate item found with id {item_id}. Remove duplicate items from your input and "
                           "try again.", param=f"items[{position}]")
