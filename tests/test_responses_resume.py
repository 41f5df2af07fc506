"""Resuming a background response's stream: `GET /v1/responses/{id}?stream=true[&starting_after=N]` through the
openai SDK (`client.responses.retrieve(id, stream=True, starting_after=...)`): the events a streamed create
sends, with their sequence numbers, replayed and then followed while the response runs."""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL, LiveServer
from tests.open_responses import validate_event
from tests.test_e2e_chat import client_for

SCRIPT = ("<|channel|>analysis<|message|>Thinking about the weather in short words.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>" + " word" * 60 + "<|return|>")


def _shape(events: list[Any]) -> list[tuple[str, int]]:
    return [(event.type, event.sequence_number) for event in events]


def same_stream(events: list[Any], streamed: list[Any]) -> None:
    """`events` is a stream as `streamed` was: numbered 0, 1, 2, ..., the same events in the same order, but
    for how the text deltas were cut (an engine step that ran late brings several tokens, one delta for all)."""
    assert [event.sequence_number for event in events] == list(range(len(events)))

    def kinds(stream: list[Any]) -> list[str]:
        return [event.type for n, event in enumerate(stream)
                if not (event.type.endswith(".delta") and n and stream[n - 1].type == event.type)]

    assert kinds(events) == kinds(streamed)


def _deltas(events: list[Any]) -> str:
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


def test_a_running_background_response_streams_as_a_streamed_create_would(serve: Callable[..., LiveServer]) -> None:
    client = client_for(serve(completions=[SCRIPT], token_delay=0.01))
    streamed = list(client.responses.create(model=MODEL, input="hi", stream=True))
    job = client.responses.create(model=MODEL, input="hi", background=True)
    started = time.monotonic()
    resumed = list(client.responses.retrieve(job.id, stream=True))
    assert time.monotonic() - started > 0.3  # it followed the run, which takes ~0.7 s, rather than replaying it
    same_stream(resumed, streamed)
    assert resumed[0].type == "response.created" and resumed[-1].type == "response.completed"
    assert _deltas(resumed) == _deltas(streamed) == " word" * 60
    assert resumed[-1].response.model_dump() == client.responses.retrieve(job.id).model_dump()
    for event in resumed:
        validate_event(event.model_dump(mode="json", exclude_unset=True))

    after = resumed[len(resumed) // 2].sequence_number
    again = list(client.responses.retrieve(job.id, stream=True, starting_after=after))  # ended: a replay only
    assert [event.model_dump() for event in again] == [event.model_dump() for event in resumed if
                                                       event.sequence_number > after]
    running = client.responses.create(model=MODEL, input="hi", background=True)
    time.sleep(0.3)
    tail = list(client.responses.retrieve(running.id, stream=True, starting_after=5))
    whole = list(client.responses.retrieve(running.id, stream=True))
    assert _shape(tail) == _shape(whole)[6:] and tail[-1].type == "response.completed"
    same_stream(whole, streamed)


def test_what_cannot_be_streamed_from_a_get(serve: Callable[..., LiveServer], tmp_path: Path) -> None:
    server = serve(completions=[SCRIPT], token_delay=0.01)
    client = client_for(server)
    plain = client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.retrieve(plain.id, stream=True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing", stream=True)
    job = client.responses.create(model=MODEL, input="hi", background=True)
    for bad in ("-1", "x", "1.5"):
        answer = httpx.get(f"{server.base_url}/v1/responses/{job.id}",
                           params={"stream": "true", "starting_after": bad}, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "starting_after"
    time.sleep(0.1)
    cancelled = client.responses.cancel(job.id)
    events = list(client.responses.retrieve(job.id, stream=True))  # a cancelled run's stream ends where it stopped
    assert cancelled.status == "cancelled" and events[0].type == "response.created"
    assert all(b.sequence_number == a.sequence_number + 1 for a, b in itertools.pairwise(events))
    def stored_events() -> int:
        with sqlite3.connect(tmp_path / "responses.sqlite3") as db:  # the serve fixture's store
            return db.execute("SELECT count(*) FROM response_events WHERE response_id = ?", (job.id,)).fetchone()[0]

    assert stored_events() == len(events)
    client.responses.delete(job.id)
    assert stored_events() == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(job.id, stream=True)
