"""The streaming token path: several tokens per engine step give merged chunks, and still exactly the
non-streamed answer, in every API (Chat Completions, Responses, raw completions)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import WEATHER, client_for, message_answer, streamed_answer

# Reasoning, a preamble, a call; then reasoning and a long answer with characters JSON must escape.
CALL = ("<|channel|>analysis<|message|>Need the \"weather\" now.<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking…<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"city":"Paris \\u00e9"}<|call|>')
ANSWER = ("<|channel|>analysis<|message|>Line one\nline two\t\\ done.<|end|><|start|>assistant<|channel|>final"
          "<|message|>" + "Ça fait 18°C à Paris, \"nice\" </script> " * 12 + "<|return|>")
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize("per_step", [1, 3, 10])
def test_chat_streams_exactly_the_non_streamed_answer(
    serve: Callable[..., LiveServer], vocab: Any, per_step: int
) -> None:
    server = serve(engine=scripted_engine(vocab, [CALL, CALL, ANSWER, ANSWER], tokens_per_step=per_step))
    client = client_for(server)
    for _ in range(2):
        whole = message_answer(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER]))
        streamed, chunks = streamed_answer(
            client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], stream=True)
        )
        assert streamed == whole
    assert whole["content"].startswith("Ça fait 18°C")
    text_chunks = [c for c in chunks if c.choices and (c.choices[0].delta.content or
                                                        getattr(c.choices[0].delta, "reasoning", None))]
    generated = len(vocab.encode_harmony(ANSWER))
    # At most one chunk per field per step: merged text, never more chunks than steps.
    assert len(text_chunks) <= -(-generated // per_step) + 1


@pytest.mark.parametrize("per_step", [1, 10])
def test_responses_stream_exactly_the_non_streamed_response(
    serve: Callable[..., LiveServer], vocab: Any, per_step: int
) -> None:
    server = serve(engine=scripted_engine(vocab, [CALL, CALL, ANSWER, ANSWER], tokens_per_step=per_step))
    body = {"model": MODEL, "input": "Weather?", "store": False, "tools": [{"type": "function", **WEATHER["function"]}]}
    for _ in range(2):
        whole = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=30).json()
        payloads = []
        with httpx.stream("POST", f"{server.base_url}/v1/responses", json={**body, "stream": True},
                          timeout=30) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    payloads.append(json.loads(line[6:]))
        assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
        final = payloads[-1]["response"]
        # The deltas add up to each item's text.
        deltas = "".join(p["delta"] for p in payloads if p["type"] == "response.output_text.delta")
        assert deltas == "".join(part["text"] for item in final["output"] if item["type"] == "message"
                                 for part in item["content"])
        assert _without_ids(final) == _without_ids(whole)


def _without_ids(response: dict[str, Any]) -> dict[str, Any]:
    plain = {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at", "output")}
    plain["output"] = [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in response["output"]]
    return plain


@pytest.mark.parametrize("per_step", [1, 10])
def test_raw_completions_stream_exactly_the_non_streamed_text(
    serve: Callable[..., LiveServer], vocab: Any, per_step: int
) -> None:
    server = serve(engine=scripted_engine(vocab, [ANSWER], tokens_per_step=per_step))
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 500, "return_token_ids": True,
            "skip_special_tokens": False}
    whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30).json()["choices"][0]
    text, tokens = "", []
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json={**body, "stream": True}, timeout=30) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                tokens += choice["token_ids"]
    assert text == whole["text"] and tokens == whole["token_ids"]
    assert "Ça fait 18°C" in text
