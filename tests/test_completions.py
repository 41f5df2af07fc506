"""Raw `/v1/completions`: token ids or text in, text and token ids out, no Harmony parsing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, client_for
from tests.test_e2e_http import sse_payloads

RAW = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 18C."


def post(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, **body}, timeout=30)


def test_token_ids_and_text_with_or_without_special_tokens(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=[ANSWER])
    full = vocab.encode_harmony(ANSWER)
    spelled = post(server, prompt=[1, 2, 3], max_tokens=100, skip_special_tokens=False, return_token_ids=True).json()
    choice = spelled["choices"][0]
    assert choice["text"] == RAW  # the <|return|> that stopped it is not in the text
    assert choice["token_ids"] == full and choice["prompt_token_ids"] == [1, 2, 3]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == vocab.special.return_
    assert spelled["object"] == "text_completion" and spelled["id"].startswith("cmpl-")
    assert spelled["usage"] == {"prompt_tokens": 3, "completion_tokens": len(full), "total_tokens": 3 + len(full)}
    kept = post(server, prompt=[1], max_tokens=100, skip_special_tokens=False, include_stop_str_in_output=True).json()
    assert kept["choices"][0]["text"] == RAW + "<|return|>"
    plain = post(server, prompt="hello", max_tokens=100).json()["choices"][0]
    assert plain["text"] == "analysisEasy.assistantfinalIt is 18C." and "token_ids" not in plain


def test_streaming_matches_non_streaming(serve: Callable[..., LiveServer], vocab: Any) -> None:
    server = serve(completions=["<|channel|>final<|message|>日本語 🧪 ok<|return|>"])
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 100, "skip_special_tokens": False,
            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as response:
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    *choice_chunks, usage_chunk = chunks
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    text = "".join(c["choices"][0]["text"] for c in choice_chunks)
    tokens = [t for c in choice_chunks for t in c["choices"][0]["token_ids"]]
    assert text == "<|channel|>final<|message|>日本語 🧪 ok"
    assert "\ufffd" not in text  # split characters were held back, not broken
    assert tokens == vocab.encode_harmony("<|channel|>final<|message|>日本語 🧪 ok<|return|>")
    assert choice_chunks[-1]["choices"][0]["finish_reason"] == "stop"
    openai_stream = client_for(server).completions.create(model=MODEL, prompt="x", max_tokens=100, stream=True)
    assert "".join(c.choices[0].text for c in openai_stream if c.choices) == "final日本語 🧪 ok"


def test_ids_in_logprobs_as_vllm_writes_them(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """`logprobs: 0` with `return_tokens_as_token_ids`: the generated ids as `token_id:N` in `logprobs.tokens`, in
    every chunk and in the whole answer, and no prompt ids (how a front harmony-proxy asks its upstream)."""
    server = serve(completions=[ANSWER])
    full = vocab.encode_harmony(ANSWER)
    fields = {"prompt": [1, 2, 3], "max_tokens": 100, "logprobs": 0, "return_tokens_as_token_ids": True}
    whole = post(server, **fields).json()["choices"][0]
    assert whole["logprobs"] == {"tokens": [f"token_id:{t}" for t in full], "token_logprobs": [None] * len(full)}
    assert "token_ids" not in whole and "prompt_token_ids" not in whole
    with httpx.stream("POST", server.base_url + "/v1/completions", timeout=30,
                      json={"model": MODEL, **fields, "stream": True}) as response:
        payloads = sse_payloads(response)
    choices = [json.loads(p)["choices"][0] for p in payloads[:-1]]
    streamed = [token for choice in choices for token in choice["logprobs"]["tokens"]]
    assert streamed == whole["logprobs"]["tokens"]
    assert not any("token_ids" in choice or "prompt_token_ids" in choice for choice in choices)
    assert "".join(choice["text"] for choice in choices) == whole["text"]
    plain = post(server, prompt=[1], max_tokens=100, logprobs=0).json()["choices"][0]
    assert plain["logprobs"] is None  # no engine here reports logprobs; only the ids were asked for


def test_limits_stop_strings_and_stop_token_ids(serve: Callable[..., LiveServer], vocab: Any) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    cut = post(server, prompt=[1], max_tokens=4, return_token_ids=True).json()["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 4
    stopped = post(server, prompt=[1], max_tokens=100, stop=["18"]).json()["choices"][0]
    assert stopped["text"] == "analysisEasy.assistantfinalIt is " and stopped["stop_reason"] == "18"
    assert stopped["finish_reason"] == "stop"
    end = vocab.special.end
    at_end = post(server, prompt=[1], max_tokens=100, stop_token_ids=[end], return_token_ids=True).json()["choices"][0]
    assert at_end["token_ids"][-1] == end and at_end["stop_reason"] == end
    post(server, prompt=[1], max_tokens=50, ignore_eos=True, min_tokens=2, temperature=0.2, seed=3)
    sampling = engine.requests[-1].sampling
    assert (sampling.ignore_eos, sampling.min_tokens, sampling.temperature, sampling.seed) == (True, 2, 0.2, 3)
    assert post(server, prompt=[1]).status_code == 200 and engine.requests[-1].sampling.max_tokens == 16


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [[1], [2]]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1], "echo": True}, "echo"),
        ({"prompt": [1], "n": 2}, "n"),
        ({"prompt": [1], "suffix": "x"}, "suffix"),
        ({"prompt": [1], "suffix": 5}, "suffix"),
        ({"prompt": [1], "logprobs": 5}, "logprobs"),
        ({"prompt": [1], "best_of": 3}, "best_of"),
        ({"prompt": [1], "foo": 1}, "foo"),
        ({"prompt": [-1]}, "prompt[0]"),
        ({"prompt": [1], "max_tokens": 10**6}, "max_tokens"),
    ],
)
def test_requests_we_cannot_honour_are_400s(serve: Callable[..., LiveServer], body: dict[str, Any], param: str) -> None:
    response = post(serve(completions=[ANSWER]), **body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_what_openai_accepts_is_accepted(serve: Callable[..., LiveServer], vocab: Any) -> None:
    """`prompt: null` (a new document: the model sees the separator alone), `top_p: 0` (the likeliest token only:
    greedy, which engines take as temperature 0), `stream_options.include_obfuscation` (nothing to pad here), and
    `suffix`, refused with the reason rather than as a type error."""
    engine = Recording(scripted_engine(vocab, [ANSWER]))
    server = serve(engine=engine)
    assert post(server, prompt=None).status_code == 200
    assert engine.requests[-1].prompt_token_ids == vocab.encode_harmony("<|endoftext|>")
    assert post(server, prompt=[1], top_p=0, temperature=0.7).status_code == 200
    assert (engine.requests[-1].sampling.temperature, engine.requests[-1].sampling.top_p) == (0.0, None)
    streamed = post(server, prompt=[1], stream=True, stream_options={"include_obfuscation": False})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    suffix = post(server, prompt=[1], suffix="x").json()["error"]
    assert suffix["code"] == "unsupported_parameter" and "fill-in-the-middle" in suffix["message"]
    assert post(server, prompt=[1], suffix=None).status_code == 200
