"""LiteLLM's `completion` against the real server: plain, streamed, and tool loops as users write them.

Users reach an OpenAI-compatible server through LiteLLM's `openai/` provider with `api_base` (LiteLLM strips the
prefix, so `openai/openai/gpt-oss-20b` asks for `openai/gpt-oss-20b`); vLLM users keep `hosted_vllm/`. Both are
tested in the tool loops. The `openai/` provider refuses `reasoning_effort` for a model it does not know as a
reasoning model (UnsupportedParamsError) unless `allowed_openai_params=["reasoning_effort"]`; `hosted_vllm/`
passes it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, CALL, WEATHER

CALLED = 'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
TOOL_RESULT = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 18 degrees<|end|>"
FIRST_REASONING = "<|channel|>analysis<|message|>Need the weather.<|end|>"
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    # Without it, importing LiteLLM tries to download its model price list, and logs the failure with no network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return importlib.import_module("litellm")


def complete(litellm: ModuleType, server: LiveServer, messages: list[Any], provider: str = "openai",
             **options: Any) -> Any:
    if provider == "openai":
        options["allowed_openai_params"] = ["reasoning_effort"]
    return litellm.completion(
        model=f"{provider}/{MODEL}", api_base=server.base_url + "/v1", api_key="unused", messages=messages,
        tools=[WEATHER], reasoning_effort="low", num_retries=0, timeout=30, **options,
    )


def test_plain_completion(serve: Callable[..., LiveServer], vocab: Any, litellm: ModuleType) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    reply = complete(litellm, server, QUESTION)
    assert "Reasoning: low" in vocab.decode(engine.requests[0].prompt_token_ids)
    assert reply.model == MODEL and reply.choices[0].finish_reason == "stop"
    message = reply.choices[0].message
    assert message.content == "It is 18C." and message.tool_calls is None
    assert message.reasoning_content == "Easy."
    assert reply.usage.completion_tokens == len(vocab.encode_harmony(ANSWER))
    assert reply.usage.completion_tokens_details.reasoning_tokens == len(vocab.encode("Easy."))


def test_streamed_answer_and_tool_call(
    serve: Callable[..., LiveServer], vocab: Any, litellm: ModuleType
) -> None:
    server = serve(completions=[ANSWER, CALL])
    chunks = list(complete(litellm, server, QUESTION, stream=True, stream_options={"include_usage": True}))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert "".join(d.content or "" for d in deltas) == "It is 18C."
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Easy."
    assert sum(1 for d in deltas if d.content) == len(vocab.encode("It is 18C."))  # one chunk a token
    built = litellm.stream_chunk_builder(chunks, messages=QUESTION)
    assert built.choices[0].message.content == "It is 18C." and built.choices[0].message.reasoning_content == "Easy."
    assert built.choices[0].finish_reason == "stop"
    assert built.usage.completion_tokens == len(vocab.encode_harmony(ANSWER))

    chunks = list(complete(litellm, server, QUESTION, stream=True))
    built = litellm.stream_chunk_builder(chunks, messages=QUESTION)
    message = built.choices[0].message
    assert built.choices[0].finish_reason == "tool_calls"
    calls = [(call.function.name, call.function.arguments) for call in message.tool_calls]
    assert calls == [("get_weather", '{"city":"Paris"}')]
    assert message.reasoning_content == "Need the weather."


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
@pytest.mark.parametrize("append", ["message", "model_dump"])
def test_tool_loop(
    serve: Callable[..., LiveServer], vocab: Any, litellm: ModuleType, provider: str, append: str
) -> None:
    """Append the returned message (the object, or its model_dump()) and the tool's result, and ask again."""
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)
    first = complete(litellm, server, QUESTION, provider)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.reasoning_content == "Need the weather."
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == '{"city":"Paris"}'
    messages = [
        *QUESTION,
        message if append == "message" else message.model_dump(),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 18 degrees"},
    ]
    second = complete(litellm, server, messages, provider)
    assert second.choices[0].message.content == "It is 18C." and second.choices[0].finish_reason == "stop"

    assert len(engine.requests) == 2
    assert all("Reasoning: low" in vocab.decode(request.prompt_token_ids) for request in engine.requests)
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert CALLED in second_prompt and TOOL_RESULT in second_prompt
    # LiteLLM sends `reasoning_content` back with the call: the model keeps its chain of thought in the loop.
    assert FIRST_REASONING in second_prompt
