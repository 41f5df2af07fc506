"""Sealed reasoning (proxy/responses/sealing.py): with `include: ["reasoning.encrypted_content"]` a reasoning item
carries a blob that, sent back by a stateless client (store=False), renders the analysis token for token as the
model wrote it; a blob that does not open falls back on the item's text, with a warning, never an error."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseReasoningItem

from proxy.engines.playback import PlaybackEngine
from proxy.engines.scripted import scripted_engine
from proxy.responses.sealing import COMPACTION, REASONING, Sealer
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL, client_for
from tests.test_mcp_loop import stream, validate_events, validate_response

KEY = "test-reasoning-key-0123456789"
INCLUDE = ["reasoning.encrypted_content"]
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
FIRST_REASONING = "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def test_a_blob_opens_only_under_its_key_kind_and_version(caplog: pytest.LogCaptureFixture) -> None:
    sealer = Sealer(KEY)
    blob = sealer.seal_reasoning((1, 2, 200005), "ignored")
    assert sealer.open_reasoning(blob).tokens == (1, 2, 200005)
    assert Sealer(KEY).open_reasoning(blob).tokens == (1, 2, 200005)  # replicas with the same key
    assert sealer.open_reasoning(sealer.seal_reasoning(None, "cut off")).text == "cut off"
    assert sealer.seal_reasoning((1,), "") != sealer.seal_reasoning((1,), "")  # a fresh nonce each time
    raw = bytearray(base64.urlsafe_b64decode(blob))
    tampered = bytearray(raw)
    tampered[-1] ^= 1
    old = bytearray(raw)
    old[0] = 0
    refused = {
        "other key": Sealer("another-key-9876543210").open_reasoning(blob),
        "random key": Sealer().open_reasoning(blob),
        "tampered": sealer.open_reasoning(base64.urlsafe_b64encode(tampered).decode()),
        "old version": sealer.open_reasoning(base64.urlsafe_b64encode(old).decode()),
        "foreign": sealer.open_reasoning("gAAAAABoFakeOpenAIBlob=="),
        "not base64": sealer.open_reasoning("é!"),
        "empty": sealer.open_reasoning(""),
        "another kind": sealer.open(COMPACTION, blob),
    }
    assert refused == dict.fromkeys(refused)
    assert sealer.open(REASONING, sealer.seal(COMPACTION, {"summary": "x"})) is None
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == len(refused) + 1
    assert sum("another key" in warning for warning in warnings) == 2
    assert sum("format version 0" in warning for warning in warnings) == 1
    with pytest.raises(ValueError):
        Sealer("short")


def reasoning_item(item: dict[str, Any], text: bool = False) -> dict[str, Any]:
    """What a stateless client sends back: the blob, and the text only when asked (the AI SDK sends none)."""
    sent = {"type": "reasoning", "id": item["id"], "summary": [], "encrypted_content": item["encrypted_content"]}
    return {**sent, "content": item["content"]} if text else sent


@pytest.mark.parametrize("streamed", [False, True])
def test_openai_sdk_store_false_gets_the_analysis_back_in_the_next_prompt(
        serve: Callable[..., LiveServer], vocab: Any, streamed: bool) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    body = {"model": MODEL, "input": [QUESTION], "tools": [WEATHER], "store": False, "include": INCLUDE}
    if streamed:
        events = stream(server, body)
        # `name` on function_call_arguments.done is the Open Responses spec's field, which the SDK's type lacks.
        validate_events([{key: value for key, value in event.items()
                          if (event["type"], key) != ("response.function_call_arguments.done", "name")}
                         for event in events])
        first = events[-1]["response"]
        done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
        assert done[0]["encrypted_content"] == first["output"][0]["encrypted_content"]
    else:
        first = client.responses.with_raw_response.create(**body).http_response.json()
    validate_response(first)
    reasoning, call = first["output"]
    ResponseReasoningItem.model_validate(reasoning, strict=True)
    blob = reasoning["encrypted_content"]
    assert isinstance(blob, str) and b"Need" not in base64.urlsafe_b64decode(blob)  # sealed, not encoded
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Need the weather."}]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 18 degrees in Paris"}
    second = client.responses.create(model=MODEL, tools=[WEATHER], store=False, include=INCLUDE,
                                     input=[QUESTION, reasoning_item(reasoning), call, output])
    assert second.output_text == "It is 18C."
    assert second.output[0].encrypted_content  # the answer's reasoning is sealed too
    prompts = [request.prompt_token_ids for request in engine.requests]
    assert FIRST_REASONING in vocab.decode(prompts[1])
    # The next prompt begins with the first prompt and the tokens the model generated, exactly.
    generated = vocab.encode_harmony(CALL)
    assert prompts[1][: len(prompts[0]) + len(generated)] == prompts[0] + generated


def test_without_include_there_is_no_blob(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=[CALL], reasoning_key=KEY)
    body = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, "input": "Weather?", "tools": [WEATHER]},
                      timeout=30).json()
    assert "encrypted_content" not in body["output"][0]


def test_the_blob_renders_the_models_own_tokens(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """The model may spell a word in tokens the tokenizer would not choose: the blob keeps its tokens."""
    odd = [*vocab.encode("Need the wea"), *vocab.encode("ther.")]
    assert odd != vocab.encode("Need the weather.")
    generated = [*vocab.encode_harmony("<|channel|>analysis<|message|>"), *odd,
                 *vocab.encode_harmony(CALL[CALL.index("<|end|>"):])]
    scripted = iter([generated, vocab.encode_harmony(ANSWER), vocab.encode_harmony(ANSWER)])
    engine = Recording(PlaybackEngine("scripted", lambda request: next(scripted)))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    first = client.responses.create(model=MODEL, input=[QUESTION], tools=[WEATHER], store=False, include=INCLUDE)
    reasoning, call = (item.model_dump(exclude_none=True) for item in first.output)
    assert reasoning["content"][0]["text"] == "Need the weather."
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    client.responses.create(model=MODEL, tools=[WEATHER], store=False, include=INCLUDE,
                            input=[QUESTION, reasoning_item(reasoning, text=True), call, output])
    prompts = [request.prompt_token_ids for request in engine.requests]
    assert prompts[1][: len(prompts[0]) + len(generated)] == prompts[0] + generated
    # Sent back as text alone, the analysis is spelled the tokenizer's way: the prefix breaks.
    client.responses.create(model=MODEL, tools=[WEATHER], store=False,
                            input=[QUESTION, {**reasoning, "encrypted_content": None}, call, output])
    third = engine.requests[2].prompt_token_ids
    assert third[: len(prompts[0]) + len(generated)] != prompts[0] + generated
    assert FIRST_REASONING in vocab.decode(third)


@pytest.mark.parametrize("case", ["tampered", "other key", "foreign"])
def test_a_blob_that_does_not_open_falls_back_on_the_text(
        serve: Callable[..., LiveServer], vocab: Any, caplog: pytest.LogCaptureFixture, case: str) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    blob = Sealer(KEY if case != "other key" else "the-key-of-another-server").seal_reasoning(
        vocab.encode("Sealed thoughts."), "")
    if case == "tampered":
        blob = blob[:-8] + ("A" if blob[-8] != "A" else "B") + blob[-7:]
    elif case == "foreign":
        blob = "gAAAAABpOpenAIStyleBlobThatIsNotOurs" * 3
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    with_text = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plain thoughts."}],
                 "encrypted_content": blob}
    without_text = {"type": "reasoning", "summary": [], "encrypted_content": blob}
    for reasoning in (with_text, without_text):
        response = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
            "model": MODEL, "tools": [WEATHER], "store": False, "include": INCLUDE,
            "input": [QUESTION, reasoning, call, output]})
        assert response.status_code == 200, response.text
    with_text_prompt, without_text_prompt = (vocab.decode(request.prompt_token_ids) for request in engine.requests)
    assert "Sealed thoughts." not in with_text_prompt + without_text_prompt
    assert "<|channel|>analysis<|message|>Plain thoughts.<|end|>" in with_text_prompt
    assert "<|channel|>analysis" not in without_text_prompt
    warnings = [record.getMessage() for record in caplog.records if "encrypted_content" in record.getMessage()]
    assert len(warnings) == 2


def test_stored_responses_keep_the_blob_for_previous_response_id(
        serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    first = client.responses.create(model=MODEL, input=[QUESTION], tools=[WEATHER], include=INCLUDE)
    assert first.output[0].encrypted_content
    assert client.responses.retrieve(first.id).output[0].encrypted_content == first.output[0].encrypted_content
    client.responses.create(model=MODEL, tools=[WEATHER], previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "sunny"}])
    prompts = [request.prompt_token_ids for request in engine.requests]
    generated = vocab.encode_harmony(CALL)
    assert prompts[1][: len(prompts[0]) + len(generated)] == prompts[0] + generated
