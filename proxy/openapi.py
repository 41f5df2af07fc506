"""An OpenAPI 3.1 document of the HTTP routes, made from the JSON Schemas the routes check bodies with.

Nothing is written twice: each request body is the schema its route validates against, with the parts a route
checks one by one (chat messages by role, Responses input items by type, tools by type) put in place, so that a
schema-driven client (tests/test_fuzz_routes.py runs schemathesis with it) reaches the checks behind the first.
The WebSocket of the Responses API is not an OpenAPI operation; its messages are fuzzed on their own. The server
serves the document at `GET /openapi.json`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from proxy.chat.schema import CHAT_REQUEST, MESSAGES
from proxy.completions import COMPLETIONS_REQUEST
from proxy.responses import conversations
from proxy.responses.request.hosted_request import BROWSER_TOOL, MCP_TOOL, PYTHON_TOOL
from proxy.responses.request.schema import CUSTOM_TOOL, FUNCTION_TOOL, ITEMS, NAMESPACE_TOOL, RESPONSES_REQUEST

_STRING = {"type": "string"}
_PAGE = [("after", _STRING), ("limit", {"type": "integer"}), ("order", {"enum": ["asc", "desc"]}),
         ("include", {"type": "array", "items": _STRING})]


def _chat() -> dict[str, Any]:
    messages = {**CHAT_REQUEST["properties"]["messages"], "items": {"anyOf": list(MESSAGES.values())}}
    return {**CHAT_REQUEST, "properties": {**CHAT_REQUEST["properties"], "messages": messages}}


def _responses() -> dict[str, Any]:
    properties = RESPONSES_REQUEST["properties"]
    tool = {"anyOf": [FUNCTION_TOOL, CUSTOM_TOOL, NAMESPACE_TOOL, MCP_TOOL, BROWSER_TOOL, PYTHON_TOOL]}
    item = {"anyOf": list(ITEMS.values())}
    return {**RESPONSES_REQUEST, "properties": {
        **properties,
        "input": {"anyOf": [_STRING, {"type": "array", "items": item}]},
        "tools": {"type": ["array", "null"], "items": tool},
    }}


def _conversation_items(body: dict[str, Any]) -> dict[str, Any]:
    """A Conversations body whose `items` are typed as the Responses input items they become."""
    items = {"type": "array", "maxItems": conversations.MAX_ITEMS_PER_REQUEST, "items": {"anyOf": list(ITEMS.values())}}
    typed = {"anyOf": [{"type": "null"}, items]} if "anyOf" in body["properties"]["items"] else items
    return {**body, "properties": {**body["properties"], "items": typed}}


def _post(body: dict[str, Any], *path_names: str) -> dict[str, Any]:
    return {"post": {**_operation(path_names), "requestBody": {
        "required": True, "content": {"application/json": {"schema": body}}}}}


def _operation(path_names: tuple[str, ...], query: list[tuple[str, dict[str, Any]]] = ()) -> dict[str, Any]:
    parameters = [{"name": name, "in": "path", "required": True, "schema": _STRING} for name in path_names]
    parameters += [{"name": name, "in": "query", "required": False, "schema": schema} for name, schema in query]
    return {"parameters": parameters, "responses": {"default": {"description": "OpenAI's shape"}}}


def openapi_document() -> dict[str, Any]:
    """Every HTTP route of `proxy/app.py` (tests/test_fuzz_routes.py checks that none is missing)."""
    responses, chat = _responses(), _chat()
    response_id, conversation_id = "response_id", "conversation_id"
    get = {"get": _operation(())}
    return {
        "openapi": "3.1.0",
        "info": {"title": "harmony-proxy", "version": "1"},
        "paths": {
            "/v1/chat/completions": _post(chat),
            "/tokenize": _post(chat),
            "/v1/completions": _post(COMPLETIONS_REQUEST),
            "/v1/responses": _post(responses),
            "/v1/responses/input_tokens": _post(responses),
            "/v1/responses/compact": _post({**responses, "required": ["model"]}),  # as OpenAI, and the route
            "/v1/responses/{response_id}": {"get": _operation((response_id,), [("stream", _STRING),
                                                                                ("starting_after", _STRING)]),
                                            "delete": _operation((response_id,))},
            "/v1/responses/{response_id}/input_items": {"get": _operation((response_id,), _PAGE)},
            "/v1/responses/{response_id}/cancel": {"post": _operation((response_id,))},
            "/v1/conversations": _post(_conversation_items(conversations.CREATE_REQUEST)),
            "/v1/conversations/{conversation_id}": {**_post(conversations.UPDATE_REQUEST, conversation_id),
                                                    "get": _operation((conversation_id,)),
                                                    "delete": _operation((conversation_id,))},
            "/v1/conversations/{conversation_id}/items": {**_post(_conversation_items(conversations.ADD_REQUEST),
                                                                conversation_id),
                                                          "get": _operation((conversation_id,), _PAGE)},
            "/v1/conversations/{conversation_id}/items/{item_id}": {
                "get": _operation((conversation_id, "item_id"), _PAGE[3:]),
                "delete": _operation((conversation_id, "item_id"))},
            "/v1/models": {"get": _operation((), [("client_version", _STRING)])},
            "/v1/models/{model}": {"get": _operation(("model",))},
            "/health": get, "/live": get, "/ready": get, "/metrics": get, "/": get, "/playground": get,
            "/openapi.json": get, "/kv_event_sources": get,
        },
    }


async def openapi_json(request: Request) -> JSONResponse:
    """`GET /openapi.json`: the document, for clients and fuzzers to read."""
    return JSONResponse(openapi_document())
