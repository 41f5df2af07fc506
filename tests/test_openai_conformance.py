"""Conformance with OpenAI's API and the openai SDK's types (issue 34, item 10), against the real server:
an image's `detail` defaults to `auto` wherever the item comes back, `top_p: 0` is greedy on every API, a chat
text part without its text names the missing field, streamed completions carry `usage: null` with
`include_usage`, `max_output_tokens` below OpenAI's minimum of 16 is OpenAI's 400, and the OpenAPI document is
served at `/openapi.json`, with `model` required on `/v1/responses/compact`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai.types.conversations.conversation_item import ConversationItem
from openai.types.responses.response_input_message_item import ResponseInputMessageItem
from pydantic import TypeAdapter

from proxy.engines.scripted import scripted_engine
from proxy.openapi import openapi_document
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER
from tests.test_e2e_http import sse_payloads

IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
LOOK = {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, IMAGE]}


def call(server: LiveServer, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, server.base_url + path, json=body, timeout=60)


def test_an_image_without_detail_comes_back_with_openais_default(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    created = call(server, "POST", "/v1/responses", {"model": MODEL, "input": [LOOK], "max_output_tokens": 16})
    assert created.status_code == 200, created.text
    listed = call(server, "GET", f"/v1/responses/{created.json()['id']}/input_items").json()["data"]
    assert listed[0]["content"][1]["detail"] == "auto"
    ResponseInputMessageItem.model_validate(listed[0], strict=True)  # `detail` is required by the SDK's type

    conversation = call(server, "POST", "/v1/conversations", {"items": [LOOK]}).json()
    items = call(server, "GET", f"/v1/conversations/{conversation['id']}/items").json()["data"]
    assert items[0]["content"][1]["detail"] == "auto"
    assert TypeAdapter(ConversationItem).validate_python(items[0]).content[1].detail == "auto"

    compacted = call(server, "POST", "/v1/responses/compact", {"model": MODEL, "input": [LOOK]})
    assert compacted.status_code == 200, compacted.text
    kept = [item for item in compacted.json()["output"] if item["type"] == "message"]
    assert kept[0]["content"][1]["detail"] == "auto"
    given = call(server, "POST", "/v1/responses", {"model": MODEL, "input": [
        {"role": "user", "content": [{**IMAGE, "detail": "low"}]}], "max_output_tokens": 16}).json()
    assert call(server, "GET", f"/v1/responses/{given['id']}/input_items").json()["data"][0]["content"][0][
        "detail"] == "low"  # a detail given is kept


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_top_p_zero_is_greedy(serve: Callable[..., LiveServer], vocab: Any, path: str) -> None:
    """The spec's minimum is 0, inclusive (completions took it already): the likeliest token only, which engines
    take as temperature 0 (vLLM and TensorRT-LLM refuse a top_p of 0)."""
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    question = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"input": "hi"}
    answered = call(server, "POST", path, {"model": MODEL, **question, "top_p": 0, "temperature": 0.7})
    assert answered.status_code == 200, answered.text
    assert (engine.requests[-1].sampling.temperature, engine.requests[-1].sampling.top_p) == (0.0, None)
    refused = call(server, "POST", path, {"model": MODEL, **question, "top_p": -0.1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_p"


def test_a_chat_text_part_without_text_names_the_missing_field(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    missing = call(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text"}]}]})
    assert missing.status_code == 400
    assert missing.json()["error"] == {"message": "Missing required parameter: 'messages[0].content[1].text'.",
                                       "type": "invalid_request_error", "param": "messages[0].content[1].text",
                                       "code": "missing_required_parameter"}
    wrong = call(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "text", "text": None}]}]})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "messages[0].content[0].text"


@pytest.mark.parametrize("include_usage", [True, False])
def test_streamed_completions_carry_usage_null_with_include_usage(serve: Callable[..., LiveServer],
                                                                  include_usage: bool) -> None:
    """OpenAI's chunks: with include_usage, `usage: null` on every chunk but the last, which has the usage and no
    choices; without it, no `usage` at all."""
    server = serve(completions=[ANSWER])
    body = {"model": MODEL, "prompt": "x", "max_tokens": 100, "stream": True,
            "stream_options": {"include_usage": include_usage}}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as response:
        chunks = [json.loads(payload) for payload in sse_payloads(response)[:-1]]
    if include_usage:
        *choices, last = chunks
        assert len(choices) > 1 and all("usage" in chunk and chunk["usage"] is None for chunk in choices)
        assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
    else:
        assert all("usage" not in chunk for chunk in chunks)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/input_tokens"])
def test_max_output_tokens_below_16_is_openais_400(serve: Callable[..., LiveServer], path: str) -> None:
    """What OpenAI answers (its spec's minimum is 16)."""
    server = serve()
    refused = call(server, "POST", path, {"model": MODEL, "input": "hi", "max_output_tokens": 15})
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 15 "
                   "instead.",
        "type": "invalid_request_error", "param": "max_output_tokens", "code": "integer_below_min_value"}
    assert call(server, "POST", path, {"model": MODEL, "input": "hi", "max_output_tokens": 16}).status_code == 200


def test_the_openapi_document_is_served_and_compact_requires_model(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    served = call(server, "GET", "/openapi.json")
    assert served.status_code == 200 and served.headers["content-type"] == "application/json"
    assert served.json() == json.loads(json.dumps(openapi_document()))
    compact = served.json()["paths"]["/v1/responses/compact"]["post"]["requestBody"]["content"]["application/json"]
    assert "model" in compact["schema"]["required"]
    assert call(server, "POST", "/v1/responses/compact", {"input": "hi"}).json()["error"]["param"] == "model"
