"""The Responses API end to end: the real server, the official openai client, the Open Responses models."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.engines.base import EngineError
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import scripted_engine
from proxy.store.base import StoredResponse
from proxy.store.sqlite import SQLiteResponseStore
from tests.conftest import MODEL, LiveServer
from tests.engines import Failing, Recording
from tests.grammars import session_matchers
from tests.open_responses import validate_event, validate_resource
from tests.test_e2e_chat import ANSWER, CALL, client_for
from tests.waiting import eventually

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def raw(server: LiveServer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, server.base_url + path, timeout=30, **kwargs)


def stream_events(server: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.base_url + "/v1/responses", json={"model": MODEL, "stream": True, **body},
                      timeout=30) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    events = []
    for name_line, data_line in pairwise(lines):
        if name_line.startswith("event: "):
            event = json.loads(data_line[len("data: "):])
            assert event["type"] == name_line[len("event: "):]  # the SSE event name is the payload's type
            events.append(event)
    return events


def test_plain_response(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve(completions=[ANSWER]))
    response = client.responses.create(model=MODEL, input="Weather in Paris?")
    assert response.output_text == "It is 18C." and response.status == "completed"
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text == "Easy."
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage.output_tokens_details.reasoning_tokens > 0 and usage.input_tokens_details.cached_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    validate_resource(response.model_dump(mode="json", exclude_unset=True))


def test_function_call_response(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[CALL])
    body = raw(server, "POST", "/v1/responses", json={"model": MODEL, "input": "Weather?", "tools": [WEATHER]}).json()
    validate_resource(body)
    call = body["output"][1]
    assert call == {"id": call["id"], "type": "function_call", "status": "completed", "call_id": call["call_id"],
                    "name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    assert body["tools"] == [{**WEATHER, "strict": None}] and body["tool_choice"] == "auto"


def test_previous_response_id_across_a_tool_call_and_its_output(
    serve: Callable[..., LiveServer], vocab: Any
) -> None:
    engine = Recording(mock_engine(vocab, matchers=session_matchers(vocab)))
    client = client_for(serve(engine=engine))
    first = client.responses.create(model=MODEL, input="Please use get_weather for Paris.", tools=[WEATHER],
                                    instructions="Old instructions.")
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], instructions="New instructions.",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 degrees"}],
    )
    assert "get_weather returned: sunny, 18 degrees" in second.output_text  # the mock read the result back
    assert second.previous_response_id == first.id and second.instructions == "New instructions."
    prompt = vocab.decode(engine.requests[-1].prompt_token_ids)
    assert "New instructions." in prompt and "Old instructions." not in prompt  # OpenAI's rule
    reasoning = first.output[0].content[0].text
    assert f"<|channel|>analysis<|message|>{reasoning}<|end|>" in prompt  # the tool loop is still going
    assert f"to=functions.get_weather <|constrain|>json<|message|>{call.arguments}<|call|>" in prompt
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 18 degrees" in prompt
    third = client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks!")
    third_prompt = vocab.decode(engine.requests[-1].prompt_token_ids)
    assert reasoning not in third_prompt and second.output_text in third_prompt  # finished turns lose analysis
    assert third.status == "completed"


@pytest.mark.parametrize(("completion", "kinds"), [(ANSWER, ["reasoning", "message"]),
                                                   (CALL, ["reasoning", "function_call"])])
def test_stream_helper_and_event_order(serve: Callable[..., LiveServer], completion: str, kinds: list[str]) -> None:
    server = serve(completions=[completion, completion])
    with client_for(server).responses.stream(model=MODEL, input="Weather?", tools=[WEATHER]) as stream:
        helper_events = [event.type for event in stream]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == kinds
    events = stream_events(server, {"input": "Weather?", "tools": [WEATHER]})
    assert [e["type"] for e in events] == helper_events
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        validate_event(event)
    text_events = {"reasoning": ["response.content_part.added", "response.reasoning_text.delta",
                                 "response.reasoning_text.done", "response.content_part.done"],
                   "function_call": ["response.function_call_arguments.delta", "response.function_call_arguments.done"]}
    expected = ["response.created", "response.in_progress"]
    for kind in kinds:
        middle = text_events.get(kind, ["response.content_part.added", "response.output_text.delta",
                                        "response.output_text.done", "response.content_part.done"])
        expected += ["response.output_item.added", *middle, "response.output_item.done"]
    expected.append("response.completed")
    deduplicated = [t for i, t in enumerate(e["type"] for e in events) if i == 0 or events[i - 1]["type"] != t
                    or not t.endswith(".delta")]
    assert deduplicated == expected
    done = events[-1]["response"]
    for event in events:  # ids and indexes in the events are those of the final response
        if "item" in event:
            assert done["output"][event["output_index"]]["id"] == event["item"]["id"]
        if "item_id" in event:
            assert done["output"][event["output_index"]]["id"] == event["item_id"]
    assert done["output"] == [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert raw(server, "GET", f"/v1/responses/{done['id']}").json() == done  # stored as streamed


def test_open_responses_event_names_and_summary_events(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], open_responses_events=True, reasoning_summary_events=True)
    events = stream_events(server, {"input": "hi"})
    types = [e["type"] for e in events]
    assert "response.reasoning.delta" in types and "response.reasoning_text.delta" not in types
    for summary in ("response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
                    "response.reasoning_summary_text.done", "response.reasoning_summary_part.done"):
        assert summary in types
    for event in events:
        validate_event(event, spec_names=True)
    reasoning = events[-1]["response"]["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Easy."}]


def test_retrieve_delete_and_input_items(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER])
    client = client_for(server)
    inputs = [{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "one"},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]}]
    created = client.responses.create(model=MODEL, input=inputs, metadata={"case": "items"})
    retrieved = raw(server, "GET", f"/v1/responses/{created.id}").json()
    validate_resource(retrieved)
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    listed = client.responses.input_items.list(created.id, order="asc")
    texts = [item.content[0].text for item in listed.data]
    assert texts == ["Be kind.", "one", "two"] and all(item.id.startswith("msg_") for item in listed.data)
    newest = raw(server, "GET", f"/v1/responses/{created.id}/input_items", params={"limit": 2}).json()
    assert [i["content"][0]["text"] for i in newest["data"]] == ["two", "one"] and newest["has_more"] is True
    after = raw(server, "GET", f"/v1/responses/{created.id}/input_items",
                params={"order": "asc", "after": listed.data[0].id}).json()
    assert [i["content"][0]["text"] for i in after["data"]] == ["one", "two"] and after["has_more"] is False
    assert after["first_id"] == listed.data[1].id and after["last_id"] == listed.data[2].id
    deleted = raw(server, "DELETE", f"/v1/responses/{created.id}").json()
    assert deleted == {"id": created.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_store_false_and_item_references(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    client = client_for(serve(engine=engine))
    private = client.responses.create(model=MODEL, input="secret", store=False)
    assert private.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(private.id)
    with pytest.raises(openai.NotFoundError) as continued:
        client.responses.create(model=MODEL, input="more", previous_response_id=private.id)
    assert continued.value.body["param"] == "previous_response_id"
    kept = client.responses.create(model=MODEL, input="Remember the word avocado.")
    answer_id = kept.output[1].id
    client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": answer_id},
                                                 {"role": "user", "content": "What did you say?"}])
    prompt = vocab.decode(engine.requests[-1].prompt_token_ids)
    assert "<|channel|>final<|message|>It is 18C.<|end|><|start|>user<|message|>What did you say?" in prompt
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_missing"}])


def test_no_store_server(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve(completions=[ANSWER], store_path=None))
    response = client.responses.create(model=MODEL, input="hi")
    assert response.store is False  # the response says it was not stored
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_responses_survive_a_restart(serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path) -> None:
    path = tmp_path / "kept.sqlite3"
    first = serve(completions=[ANSWER], store_path=path)
    created = client_for(first).responses.create(model=MODEL, input="hi")
    first.stop()
    # A background response that a crashed process left in progress.
    store = SQLiteResponseStore(path)
    import asyncio

    stale = dict(created.model_dump(mode="json"), id="resp_stale", status="in_progress", background=True)
    asyncio.run(store.save(StoredResponse(stale, [])))
    asyncio.run(store.close())
    second = client_for(serve(completions=[ANSWER], store_path=path))
    assert second.responses.retrieve(created.id).model_dump() == created.model_dump()
    assert second.responses.input_items.list(created.id).data[0].content[0].text == "hi"
    interrupted = second.responses.retrieve("resp_stale")
    assert interrupted.status == "failed" and interrupted.error.code == "server_restarted"
    validate_resource(interrupted.model_dump(mode="json", exclude_unset=True))
    follow = second.responses.create(model=MODEL, input="again", previous_response_id=created.id)
    assert follow.status == "completed"


def test_background_response_and_cancel(serve: Callable[..., LiveServer], vocab: Any) -> None:
    long = "<|channel|>final<|message|>" + " word" * 400 + "<|return|>"
    engine = Recording(scripted_engine(vocab, [ANSWER, long], token_delay=0.01))
    client = client_for(serve(engine=engine))
    quick = client.responses.create(model=MODEL, input="hi", background=True)
    assert quick.status in ("queued", "in_progress") and quick.background is True
    validate_resource(quick.model_dump(mode="json", exclude_unset=True))
    while (current := client.responses.retrieve(quick.id)).status in ("queued", "in_progress"):
        time.sleep(0.05)  # as long as it takes: pytest-timeout catches a hang
    assert current.status == "completed" and current.output_text == "It is 18C."
    eventually(engine.finished.is_set)  # its stream's end: then `finished` is left to the long one, the control
    engine.finished.clear()
    slow = client.responses.create(model=MODEL, input="long", background=True)
    while not (progress := client.responses.retrieve(slow.id)).output_text:  # its first words, while it runs
        assert progress.status in ("queued", "in_progress"), progress
        time.sleep(0.05)
    assert progress.status == "in_progress" and progress.output and progress.output_text  # partial output
    cancelled = client.responses.cancel(slow.id)
    assert cancelled.status == "cancelled"
    for body in (current, progress, cancelled):
        validate_resource(body.model_dump(mode="json", exclude_unset=True))
    eventually(lambda: engine.cancelled.is_set() or engine.finished.is_set())  # closed, or run to its end
    assert engine.cancelled.is_set() and not engine.finished.is_set()
    assert client.responses.retrieve(slow.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(model=MODEL, input="x").id)  # not a background response


def test_incomplete_and_failed(serve: Callable[..., LiveServer], vocab: Any) -> None:
    client = client_for(serve(completions=[ANSWER]))
    cut = client.responses.create(model=MODEL, input="hi", max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[-1].status == "incomplete"
    validate_resource(cut.model_dump(mode="json", exclude_unset=True))
    failing = serve(engine=Failing(scripted_engine(vocab, [ANSWER]), EngineError("GPU fault", 500, "gpu"), after=6))
    events = stream_events(failing, {"input": "hi"})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "gpu", "message": "GPU fault"}
    assert all(e["item"]["status"] != "in_progress" for e in events if e["type"] == "response.output_item.done")
    for event in events:
        validate_event(event)
    plain = raw(failing, "POST", "/v1/responses", json={"model": MODEL, "input": "hi"}).json()
    assert plain["status"] == "failed" and plain["error"]["message"] == "GPU fault"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "x", "tools": [{"type": "file_search"}]}, 400, "tools[0].type"),
        ({"input": "x", "truncation": "auto"}, 400, "truncation"),
        ({"input": "x", "background": True, "store": False}, 400, "background"),
        ({"input": "x", "background": True, "stream": True}, 400, "stream"),
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
        ({"input": "x", "reasoning": {"effort": "ultra"}}, 400, "reasoning.effort"),
        ({"input": [{"role": "developer", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
         "input[0].content[0]"),
        ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, 400, "input[0].call_id"),
        ({"input": [{"type": "computer_call"}]}, 400, "input[0].type"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, 400, "include[0]"),
        ({"input": "x", "prompt": {"id": "pmpt_1"}}, 400, "prompt"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
        ({"input": "x", "max_output_tokens": 10**6}, 400, "max_output_tokens"),
        ({"model": "gpt-4o", "input": "x"}, 404, "model"),
        ({"input": []}, 400, "input"),
        ({"input": "x", "foo": 1}, 400, "foo"),
    ],
)
def test_bad_requests(serve: Callable[..., LiveServer], body: dict[str, Any], status: int, param: str) -> None:
    response = raw(serve(completions=[ANSWER]), "POST", "/v1/responses", json={"model": MODEL, **body})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_structured_output_format_reaches_the_prompt(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, ['<|channel|>final<|message|>{"value": 4}<|return|>']))
    server = serve(engine=engine)
    text = {"format": {"type": "json_schema", "name": "answer", "strict": True,
                       "schema": {"type": "object", "properties": {"value": {"type": "integer"}}}}}
    body = raw(server, "POST", "/v1/responses", json={"model": MODEL, "input": "2+2", "text": text}).json()
    validate_resource(body)
    assert body["text"]["format"] == text["format"]
    assert '# Response Formats\n\n## answer\n\n{"type":"object"' in vocab.decode(engine.requests[-1].prompt_token_ids)


def test_replayed_item_ids_stay_with_their_own_response(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER])
    client = client_for(server)
    first = client.responses.create(model=MODEL, input="hi")
    replay = [item.model_dump(mode="json", exclude_none=True) for item in first.output]
    second = client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}, *replay,
                                                          {"role": "user", "content": "again"}])
    client.responses.delete(second.id)  # removes the second response's copy of the replayed items only
    answer_id = first.output[1].id
    third = client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": answer_id}])
    assert third.status == "completed"
    assert client.responses.retrieve(first.id).output[1].id == answer_id


def test_shutdown_marks_running_background_responses_failed(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.sqlite3"
    long = "<|channel|>final<|message|>" + " word" * 400 + "<|return|>"
    server = serve(engine=scripted_engine(vocab, [long], token_delay=0.01), store_path=path)
    job = client_for(server).responses.create(model=MODEL, input="long", background=True)
    time.sleep(0.2)
    server.stop()
    after = client_for(serve(completions=[ANSWER], store_path=path)).responses.retrieve(job.id)
    assert after.status == "failed" and after.error.code == "server_shutdown"
    validate_resource(after.model_dump(mode="json", exclude_unset=True))
