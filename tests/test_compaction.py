"""Compaction by gpt-oss itself (proxy/responses/compaction.py): `POST /v1/responses/compact`, `context_management`
on create, Codex's `compaction_trigger`, the compaction item expanding into later prompts, and openai-agents'
compaction session, against the real server with the openai SDK. New objects are checked against the SDK's types."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession
from openai import AsyncOpenAI
from openai.types.responses import CompactedResponse, ResponseCompactionItem, ResponseInputMessageItem

from proxy.engines.scripted import scripted_engine
from proxy.responses.compaction import INSTRUCTION
from proxy.responses.compaction_items import SUMMARY_HEADING
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL, client_for
from tests.test_mcp_loop import stream, validate_events, validate_response
from tests.test_sealed_reasoning import INCLUDE, KEY, QUESTION, WEATHER

set_tracing_disabled(True)

SUMMARY = "Task: weather in Paris. get_weather said sunny, 18C. Next: answer the user."
SUMMARIZED = (f"<|channel|>analysis<|message|>Summarize the work.<|end|><|start|>assistant<|channel|>final"
              f"<|message|>{SUMMARY}<|return|>")
LATER = {"role": "user", "content": "And tomorrow?"}


def session_so_far(client: Any) -> list[dict[str, Any]]:
    """A stateless tool loop, answered: question, reasoning, call, output, reasoning, answer."""
    first = client.responses.create(model=MODEL, input=[QUESTION], tools=[WEATHER], store=False, include=INCLUDE)
    items = [QUESTION, *(item.model_dump(exclude_none=True) for item in first.output)]
    items.append({"type": "function_call_output", "call_id": items[-1]["call_id"], "output": "sunny, 18C"})
    second = client.responses.create(model=MODEL, input=items, tools=[WEATHER], store=False, include=INCLUDE)
    return items + [item.model_dump(exclude_none=True) for item in second.output]


def test_compact_endpoint_and_the_next_turn(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER, SUMMARIZED, ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    items = session_so_far(client)
    # Codex sends its tools with a compaction too (the SDK takes them as extra fields): the prefix stays the same.
    raw = client.responses.with_raw_response.compact(model=MODEL, input=items, extra_body={"tools": [WEATHER]})
    body = raw.http_response.json()
    assert body["object"] == "response.compaction" and body["id"].startswith("resp_")
    *kept, item = body["output"]
    # The SDK types the window's output as output items, which have no user message (OpenAI returns them too):
    # the envelope and the compaction item are checked by CompactedResponse, the messages as input message items.
    compacted = CompactedResponse.model_validate({**body, "output": [item]}, strict=True)
    assert [message["content"][0]["text"] for message in kept] == [QUESTION["content"]]
    for message in kept:
        ResponseInputMessageItem.model_validate(message, strict=True)
    ResponseCompactionItem.model_validate(item, strict=True)
    assert SUMMARY.encode() not in item["encrypted_content"].encode()
    assert compacted.usage.input_tokens == len(engine.requests[2].prompt_token_ids)
    assert compacted.usage.output_tokens == len(vocab.encode_harmony(SUMMARIZED))
    # The summary is generated after the conversation as rendered for an answer: it begins with the first prompt.
    first_prompt, summary_prompt = (engine.requests[i].prompt_token_ids for i in (0, 2))
    ended = vocab.decode(summary_prompt)
    assert ended.endswith(f"<|start|>user<|message|>{INSTRUCTION}<|end|><|start|>assistant")
    assert "get_weather" in ended and "sunny, 18C" in ended
    assert summary_prompt[: len(first_prompt)] == first_prompt
    # The next turn continues from the compacted window, with far fewer tokens.
    after = client.responses.create(model=MODEL, input=[*kept, item, LATER], tools=[WEATHER], store=False)
    assert after.output_text == "It is 18C."
    prompt = vocab.decode(engine.requests[3].prompt_token_ids)
    assert f"<|start|>user<|message|>{SUMMARY_HEADING}{SUMMARY}<|end|>" in prompt
    assert "sunny, 18C<|end|>" not in prompt.replace(SUMMARY, "")  # the tool output is in the summary only
    # Sending the whole history and the compaction item renders the same prompt: what precedes it is replaced.
    client.responses.create(model=MODEL, input=[*items, item, LATER], tools=[WEATHER], store=False)
    assert engine.requests[4].prompt_token_ids == engine.requests[3].prompt_token_ids


@pytest.mark.parametrize("streamed", [False, True])
def test_context_management_compacts_past_its_threshold(
        serve: Callable[..., LiveServer], vocab: Any, streamed: bool) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER, SUMMARIZED, ANSWER, ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    items = [*session_so_far(client), LATER]
    size = client.responses.input_tokens.count(model=MODEL, input=items, tools=[WEATHER]).input_tokens
    body = {"model": MODEL, "input": items, "tools": [WEATHER], "store": False, "include": INCLUDE,
            "context_management": [{"type": "compaction", "compact_threshold": size - 1}]}
    if streamed:
        events = stream(server, body)
        assert [event["type"] for event in events[2:4]] == ["response.output_item.added", "response.output_item.done"]
        validate_events(events)
        response = events[-1]["response"]
    else:
        response = httpx.post(server.base_url + "/v1/responses", json=body, timeout=30).json()
    parsed = validate_response(response)
    assert [item.type for item in parsed.output] == ["compaction", "reasoning", "message"]
    assert parsed.output_text == "It is 18C."
    summary_prompt, answer_prompt = (vocab.decode(request.prompt_token_ids) for request in engine.requests[2:4])
    assert INSTRUCTION in summary_prompt and SUMMARY in answer_prompt and "sunny, 18C<|end|>" not in answer_prompt
    # The client appends the output, compaction item included: the next request is compacted by it.
    client.responses.create(model=MODEL, tools=[WEATHER], store=False, include=INCLUDE,
                            input=[*items, *(item.model_dump(exclude_none=True) for item in parsed.output),
                                   {"role": "user", "content": "Thanks"}],
                            extra_body={"context_management": [{"type": "compaction", "compact_threshold": 2 * size}]})
    assert len(engine.requests) == 5  # under the threshold: no second compaction
    assert SUMMARY in vocab.decode(engine.requests[4].prompt_token_ids)


def test_under_the_threshold_nothing_is_compacted(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    client = client_for(server)
    size = client.responses.input_tokens.count(model=MODEL, input="Hi").input_tokens
    response = client.responses.create(model=MODEL, input="Hi", extra_body={
        "context_management": [{"type": "compaction", "compact_threshold": size}]})  # at it, not over it
    assert [item.type for item in response.output] == ["reasoning", "message"] and len(engine.requests) == 1
    assert response.usage.input_tokens == size


def test_compaction_trigger_answers_with_the_compaction_item(serve: Callable[..., LiveServer], vocab: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy.access")
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER, SUMMARIZED]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    items = session_so_far(client)
    events = stream(server, {"input": [*items, {"type": "compaction_trigger"}], "tools": [WEATHER], "store": False})
    response = validate_response(events[-1]["response"])
    assert [item.type for item in response.output] == ["compaction"] and response.status == "completed"
    assert len(engine.requests) == 3
    client.responses.create(model=MODEL, input=[*items, response.output[0].model_dump(), LATER], store=False)
    assert SUMMARY in vocab.decode(engine.requests[3].prompt_token_ids)
    logged = [record.fields.get("response_id") for record in caplog.records if record.name == "harmony_proxy.access"]
    assert response.id in logged and not any(str(id).startswith("cmp_") for id in logged)  # not the summary's id
    misplaced = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "input": [{"type": "compaction_trigger"}, LATER]})
    assert misplaced.status_code == 400 and misplaced.json()["error"]["param"] == "input[0]"


def test_a_compaction_blob_that_does_not_open_is_left_out(
        serve: Callable[..., LiveServer], vocab: Any, caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    response = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "input": [QUESTION, {"type": "compaction", "encrypted_content": "bm90IG91cnM="}, LATER]})
    assert response.status_code == 200
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert QUESTION["content"] in prompt and SUMMARY_HEADING not in prompt
    assert any("compaction item" in record.getMessage() for record in caplog.records
               if record.levelno == logging.WARNING)


def test_openai_agents_compaction_session(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Any) -> None:
    """openai-agents' OpenAIResponsesCompactionSession calls responses.compact when its history grows, and the
    next run continues from the compacted history."""
    served = "gpt-oss-20b"  # the session takes only OpenAI-style model names (gpt-*)
    engine = Recording(scripted_engine(vocab, [ANSWER, SUMMARIZED, ANSWER]))
    server = serve(engine=engine, served_model_name=served)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    agent = Agent(name="weather", instructions="Answer briefly.", model=OpenAIResponsesModel(served, client))
    session = OpenAIResponsesCompactionSession(
        "s1", SQLiteSession("s1", str(tmp_path / "agents.sqlite3")), client=client, model=served,
        should_trigger_compaction=lambda context: True)

    async def run() -> list[Any]:
        await Runner.run(agent, "What is the weather in Paris?", session=session)
        await Runner.run(agent, "And tomorrow?", session=session)
        return await session.get_items()

    history = asyncio.run(run())
    assert any(item.get("type") == "compaction" for item in history)
    prompts = [vocab.decode(request.prompt_token_ids) for request in engine.requests]
    assert INSTRUCTION in prompts[1]
    assert SUMMARY in prompts[2] and "And tomorrow?" in prompts[2]


def test_a_conversation_too_long_to_summarize_whole_loses_its_oldest_work_first(
        serve: Callable[..., LiveServer], vocab: Any, caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(scripted_engine(vocab, [SUMMARIZED]))
    server = serve(engine=engine, reasoning_key=KEY, max_model_len=1500)
    items: list[dict[str, Any]] = [QUESTION]
    for turn in range(8):
        call = {"type": "function_call", "call_id": f"call_{turn}", "name": "get_weather",
                "arguments": f'{{"city":"City{turn}"}}'}
        items += [call, {"type": "function_call_output", "call_id": f"call_{turn}",
                         "output": f"Output {turn}: " + "sunny and warm " * 80}]
    client = client_for(server)
    whole = client.responses.input_tokens.count(model=MODEL, input=items, tools=[WEATHER]).input_tokens
    assert whole > 1500
    compacted = client.responses.compact(model=MODEL, input=items, extra_body={"tools": [WEATHER]})
    assert compacted.output[-1].type == "compaction"
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert len(engine.requests[0].prompt_token_ids) <= 1500 - 375
    assert QUESTION["content"] in prompt and "Output 7:" in prompt and "Output 0:" not in prompt
    assert any("oldest" in record.getMessage() for record in caplog.records)


def test_a_stored_chain_continues_from_its_compaction(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """With store and previous_response_id, the compaction item is in the stored output: the chain's later
    prompts start from it."""
    engine = Recording(scripted_engine(vocab, [CALL, SUMMARIZED, ANSWER, ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    first = client.responses.create(model=MODEL, input=[QUESTION], tools=[WEATHER])
    output = {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "sunny, 18C"}
    second = client.responses.create(model=MODEL, input=[output], tools=[WEATHER], previous_response_id=first.id,
                                     extra_body={"context_management": [{"type": "compaction",
                                                                         "compact_threshold": 1}]})
    assert [item.type for item in second.output] == ["compaction", "reasoning", "message"]
    client.responses.create(model=MODEL, input=[LATER], tools=[WEATHER], previous_response_id=second.id)
    prompt = vocab.decode(engine.requests[3].prompt_token_ids)
    assert SUMMARY in prompt and QUESTION["content"] in prompt and "sunny, 18C<|end|>" not in prompt
    assert prompt.index(QUESTION["content"]) < prompt.index(SUMMARY) < prompt.index("It is 18C.")
