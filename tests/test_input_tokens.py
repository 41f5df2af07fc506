"""`POST /v1/responses/input_tokens` (proxy/responses/input_tokens.py): the exact prompt length, nothing generated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from openai.types.responses.input_token_count_response import InputTokenCountResponse

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording, SlowStart
from tests.test_e2e_chat import ANSWER, CALL, client_for
from tests.test_sealed_reasoning import INCLUDE, KEY, QUESTION, WEATHER, reasoning_item


def test_the_count_is_the_prompt_the_engine_gets(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    first_body = {"model": MODEL, "instructions": "Be brief.", "input": [QUESTION], "tools": [WEATHER],
                  "store": False, "include": INCLUDE, "reasoning": {"effort": "high"}}
    counted = client.responses.input_tokens.count(**{k: v for k, v in first_body.items()
                                                     if k not in ("store", "include")})
    InputTokenCountResponse.model_validate(counted.model_dump(), strict=True)
    assert counted.object == "response.input_tokens"
    assert len(engine.requests) == 0  # nothing generated
    first = client.responses.create(**first_body)
    assert counted.input_tokens == len(engine.requests[0].prompt_token_ids) == first.usage.input_tokens
    # A stateless turn with sealed reasoning: counted as rendered, reasoning tokens included.
    reasoning, call = (item.model_dump(exclude_none=True) for item in first.output)
    second_input = [QUESTION, reasoning_item(reasoning), call,
                    {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]
    raw = httpx.post(server.base_url + "/v1/responses/input_tokens", timeout=30, json={
        **first_body, "input": second_input})
    assert raw.status_code == 200, raw.text
    assert set(raw.json()) == {"object", "input_tokens"}
    client.responses.create(**{**first_body, "input": second_input})
    assert raw.json()["input_tokens"] == len(engine.requests[1].prompt_token_ids)
    # previous_response_id is resolved in the store.
    stored = client.responses.create(model=MODEL, input="Hello")
    chained = client.responses.input_tokens.count(model=MODEL, previous_response_id=stored.id, input="Again")
    client.responses.create(model=MODEL, previous_response_id=stored.id, input="Again")
    assert chained.input_tokens == len(engine.requests[-1].prompt_token_ids)


def test_counting_needs_no_ready_engine_and_refuses_bad_requests(
        serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = SlowStart(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    url = server.base_url + "/v1/responses/input_tokens"
    ok = httpx.post(url, json={"input": "Hi"}, timeout=30)  # model is optional in the count's parameters
    assert ok.status_code == 200 and ok.json()["input_tokens"] > 0
    for body, status, param in [({"model": "other", "input": "Hi"}, 404, "model"),
                                ({"input": [{"type": "nonsense"}]}, 400, "input[0].type"),
                                ({"input": "Hi", "previous_response_id": "resp_missing"}, 404,
                                 "previous_response_id")]:
        refused = httpx.post(url, json=body, timeout=30)
        assert refused.status_code == status, refused.text
        assert refused.json()["error"]["param"] == param
    engine.release.set()
