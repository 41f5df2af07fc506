"""Reasoning effort, verbosity and reasoning summaries, per request, through the openai SDK's strict types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from proxy.engines.scripted import scripted_engine
from proxy.options import VERBOSITY_NOTES
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.open_responses import validate_event
from tests.test_e2e_chat import ANSWER, client_for

HARMONY_LEVEL = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                 "max": "high"}
SUMMARY_EVENTS = ["response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
                  "response.reasoning_summary_text.done", "response.reasoning_summary_part.done"]


@pytest.fixture
def recorded(serve: Callable[..., LiveServer], vocab: Any) -> tuple[LiveServer, Recording]:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    return serve(engine=engine), engine


def prompts(engine: Recording, vocab: Any) -> list[str]:
    return [vocab.decode(request.prompt_token_ids) for request in engine.requests]


@pytest.mark.parametrize("effort", sorted(HARMONY_LEVEL))
def test_every_effort_maps_onto_a_harmony_level(
    recorded: tuple[LiveServer, Recording], vocab: Any, effort: str
) -> None:
    server, engine = recorded
    client = client_for(server)
    response = client.responses.create(model=MODEL, input="Hi", reasoning={"effort": effort})
    assert response.reasoning.effort == effort  # echoed as asked
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], reasoning_effort=effort)
    for prompt in prompts(engine, vocab):
        assert f"Reasoning: {HARMONY_LEVEL[effort]}\n" in prompt


def test_an_unknown_effort_is_a_400(recorded: tuple[LiveServer, Recording]) -> None:
    client = client_for(recorded[0])
    with pytest.raises(Exception) as refused:
        client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "ultra"})  # type: ignore[typeddict-item]
    assert getattr(refused.value, "status_code", None) == 400 and refused.value.param == "reasoning.effort"


@pytest.mark.parametrize("verbosity", ["low", "medium", "high"])
def test_verbosity_is_a_line_of_instructions(
    recorded: tuple[LiveServer, Recording], vocab: Any, verbosity: str
) -> None:
    server, engine = recorded
    client = client_for(server)
    response = client.responses.create(model=MODEL, instructions="Be kind.", input="Hi",
                                       text={"verbosity": verbosity})  # type: ignore[typeddict-item]
    assert response.text.verbosity == verbosity
    client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "Be kind."},
                                                          {"role": "user", "content": "Hi"}], verbosity=verbosity)
    for prompt in prompts(engine, vocab):
        note = VERBOSITY_NOTES.get(verbosity)
        if note is None:
            assert "Verbosity:" not in prompt
        else:  # after the client's own instructions, in the same developer message
            assert f"<|start|>developer<|message|># Instructions\n\nBe kind.\n\n{note}<|end|>" in prompt


@pytest.mark.parametrize("summary", ["auto", "concise", "detailed"])
def test_a_summary_asked_per_request_streams_summary_events(
    recorded: tuple[LiveServer, Recording], summary: str
) -> None:
    client = client_for(recorded[0])
    with client.responses.stream(model=MODEL, input="Hi", reasoning={"summary": summary}) as stream:
        events = list(stream)  # the SDK's strict event types parse every event
        final = stream.get_final_response()
    types = [event.type for event in events]
    assert list(dict.fromkeys(name for name in types if name in SUMMARY_EVENTS)) == SUMMARY_EVENTS  # in order
    deltas = "".join(event.delta for event in events if event.type == "response.reasoning_summary_text.delta")
    assert deltas == "Easy."
    for event in events:
        validate_event(event.model_dump(mode="json", exclude_unset=True, warnings=False))
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and [part.text for part in reasoning.summary] == ["Easy."]
    assert [part.text for part in reasoning.content or []] == ["Easy."]
    assert final.reasoning.summary == summary

    plain = client.responses.create(model=MODEL, input="Hi", reasoning={"summary": summary})
    assert [part.text for part in plain.output[0].summary] == ["Easy."]  # type: ignore[union-attr]


def test_without_a_summary_no_summary_events(recorded: tuple[LiveServer, Recording]) -> None:
    client = client_for(recorded[0])
    with client.responses.stream(model=MODEL, input="Hi", reasoning={"effort": "low"}) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert not set(types) & set(SUMMARY_EVENTS) and "response.reasoning_text.delta" in types
    assert final.output[0].summary == []  # type: ignore[union-attr]


def test_reasoning_with_summary_and_content_comes_back_rendered_once(
    recorded: tuple[LiveServer, Recording], vocab: Any
) -> None:
    server, engine = recorded
    client = client_for(server)
    first = client.responses.create(model=MODEL, input="Hi", reasoning={"summary": "auto"}, store=False)
    reasoning, _answer = (item.model_dump(mode="json", exclude_none=True) for item in first.output)
    assert reasoning["summary"] and reasoning["content"]
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    client.responses.create(model=MODEL, store=False, input=[
        {"role": "user", "content": "Hi"}, reasoning, call,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    client.responses.create(model=MODEL, store=False, input=[  # a summary without content counts the same
        {"role": "user", "content": "Hi"}, {**reasoning, "content": []}, call,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    for prompt in prompts(engine, vocab)[1:]:
        assert prompt.count("Easy.") == 1, prompt
        assert "<|channel|>analysis<|message|>Easy.<|end|>" in prompt
