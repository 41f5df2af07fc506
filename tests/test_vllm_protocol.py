"""The `vllm` flavor against vLLM's own protocol: every request field we send is one vLLM 0.32's `CompletionRequest`
(or, to its token-only endpoint, `GenerateRequest`) declares and carries into its `SamplingParams` (vLLM accepts
unknown fields silently, so drift would not show as an error), and our fake vLLM (tests/fake_upstreams.py) streams
what the real one streams, field for field."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from parsers.vocab import Vocab
from proxy.engines.base import GenerationRequest, OutputConstraint, SamplingParams
from proxy.engines.upstream.engine import FLAVORS, UpstreamEngine
from proxy.engines.upstream.generate import generate_body
from tests.conftest import MODEL, LiveServer
from tests.fake_upstreams import fake_upstream
from tests.test_e2e_chat import ANSWER, CALL, WEATHER, client_for
from tests.vllm_server import VllmServer, vllm_python

pytestmark = pytest.mark.timeout(900)

# Run by vLLM's Python: each body through vLLM's own request model and into its sampling parameters.
READ_BODIES = """
import json, sys
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
declared = set(CompletionRequest.model_fields)
out = []
for body in json.load(sys.stdin):
    request = CompletionRequest.model_validate(body)
    params = request.to_sampling_params(request.max_tokens, {})
    guided = params.structured_outputs
    out.append({
        "undeclared": sorted(set(body) - declared),
        "prompt": request.prompt, "stream": request.stream, "include_usage": request.stream_options.include_usage,
        "return_token_ids": request.return_token_ids, "logprobs": request.logprobs,
        "return_tokens_as_token_ids": request.return_tokens_as_token_ids,
        "sampling": {name: getattr(params, name) for name in ("max_tokens", "stop_token_ids", "temperature", "top_p",
                     "seed", "min_tokens", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output")},
        "guided": None if guided is None else {name: getattr(guided, name) for name in
                                                ("json", "grammar", "structural_tag", "regex")},
    })
print(json.dumps(out))
"""


def bodies_we_send(serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer],
                   vocab: Vocab) -> list[dict[str, Any]]:
    """The upstream requests harmony-proxy makes for plain, sampled and constrained requests, in every mode."""
    seen = []
    for mode, completion, request in (
        ("final-json", ANSWER, {"temperature": 0.5, "top_p": 0.9, "seed": 3, "max_tokens": 50}),
        ("final-json", '<|channel|>final<|message|>{"a":1}<|return|>', {"response_format": {
            "type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}}),
        ("xgrammar", CALL, {"tools": [WEATHER], "tool_choice": "required"}),
        ("llguidance", CALL, {"tools": [WEATHER], "tool_choice": "required"}),
    ):
        app = fake_upstream(vocab, "vllm", completion)
        upstream = serve_app(app)
        engine = UpstreamEngine(vocab, [upstream.base_url + "/v1"], MODEL, "vllm", guided_decoding=mode)
        client_for(serve(engine=engine)).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], **request)
        seen += app.state.seen
    return seen


def test_every_field_we_send_is_one_vllm_reads(serve: Callable[..., LiveServer],
                                                serve_app: Callable[[Any], LiveServer], vocab: Vocab) -> None:
    bodies = bodies_we_send(serve, serve_app, vocab)
    read = json.loads(subprocess.run([str(vllm_python()), "-c", READ_BODIES], input=json.dumps(bodies), text=True,
                                     capture_output=True, check=True, timeout=300).stdout.splitlines()[-1])
    for body, vllm in zip(bodies, read, strict=True):
        assert vllm["undeclared"] == [], f"fields vLLM 0.32 does not declare (it would ignore them): {vllm}"
        assert vllm["prompt"] == body["prompt"] and vllm["stream"] is True and vllm["include_usage"] is True
        # The generated ids in logprobs, never `return_token_ids` (which echoes the prompt's ids).
        assert vllm["return_token_ids"] is None and vllm["logprobs"] == 0 and vllm["return_tokens_as_token_ids"]
        sampling = vllm["sampling"]
        assert sampling["stop_token_ids"] == body["stop_token_ids"] == list(vocab.stop_token_ids)
        assert sampling["include_stop_str_in_output"] is True and sampling["skip_special_tokens"] is False
        for name in ("max_tokens", "temperature", "top_p", "seed", "min_tokens"):
            if name in body:
                assert sampling[name] == body[name], name
    assert read[0]["sampling"] | {"stop_token_ids": None} == {
        "max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "seed": 3, "min_tokens": 0, "ignore_eos": False,
        "skip_special_tokens": False, "include_stop_str_in_output": True, "stop_token_ids": None}
    guided = [vllm["guided"] for vllm in read]
    assert guided[0] is None and guided[1]["json"] == {"type": "object"}
    assert json.loads(guided[2]["structural_tag"])["type"] == "structural_tag"
    assert guided[3]["grammar"] == bodies[3]["structured_outputs"]["grammar"] and "<|call|>" in guided[3]["grammar"]


# Run by vLLM's Python: each token-only body through vLLM's own GenerateRequest.
READ_GENERATE_BODIES = """
import json, sys
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.sampling_params import SamplingParams
declared = set(GenerateRequest.model_fields)
out = []
for body in json.load(sys.stdin):
    request = GenerateRequest.model_validate(body)
    params = request.sampling_params
    guided = params.structured_outputs
    out.append({
        "undeclared": sorted(set(body) - declared),
        "unknown_sampling": sorted(set(body["sampling_params"]) - set(SamplingParams.__struct_fields__)),
        "token_ids": request.token_ids, "request_id": request.request_id, "stream": request.stream,
        "include_usage": request.stream_options.include_usage, "return_token_ids": request.return_token_ids,
        "reasoning_ended": request.reasoning_ended, "output_mode": request.output_mode,
        "sampling": {name: getattr(params, name) for name in ("max_tokens", "stop_token_ids", "temperature", "top_p",
                     "seed", "min_tokens", "ignore_eos", "detokenize")},
        "guided": None if guided is None else {name: getattr(guided, name) for name in
                                                ("json", "grammar", "structural_tag")},
    })
print(json.dumps(out))
"""


def test_every_field_we_send_to_the_token_only_endpoint_is_one_vllm_reads(
        serve: Callable[..., LiveServer], serve_app: Callable[[Any], LiveServer], vocab: Vocab) -> None:
    """The token-only bodies of the same requests: the same sampling, stop tokens and constraint, no detokenizing,
    no prompt ids back; a whole-completion grammar applies from the first token (`reasoning_ended`)."""
    completions = bodies_we_send(serve, serve_app, vocab)
    bodies = []
    for body, whole in zip(completions, (False, False, True, True), strict=True):
        fields = {name: body[name] for name in ("max_tokens", "temperature", "top_p", "seed") if name in body}
        request = GenerationRequest(f"req-{len(bodies)}", body["prompt"], SamplingParams(
            stop_token_ids=tuple(body["stop_token_ids"]), **fields), OutputConstraint())
        bodies.append(generate_body(request, MODEL, body.get("structured_outputs"), whole))
    read = json.loads(subprocess.run([str(vllm_python()), "-c", READ_GENERATE_BODIES], input=json.dumps(bodies),
                                     text=True, capture_output=True, check=True, timeout=300).stdout.splitlines()[-1])
    for body, sent, vllm in zip(completions, bodies, read, strict=True):
        assert vllm["undeclared"] == [] and vllm["unknown_sampling"] == [], vllm
        assert vllm["token_ids"] == body["prompt"] and vllm["stream"] is True and vllm["include_usage"] is True
        assert vllm["return_token_ids"] is None and vllm["output_mode"] == "tokens"
        assert vllm["request_id"] == sent["request_id"]
        sampling = vllm["sampling"]
        assert sampling["stop_token_ids"] == list(vocab.stop_token_ids) and sampling["detokenize"] is False
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            if name in body:
                assert sampling[name] == body[name], name
    assert read[0]["guided"] is None and read[0]["reasoning_ended"] is None
    assert read[1]["guided"]["json"] == {"type": "object"} and read[1]["reasoning_ended"] is None
    assert json.loads(read[2]["guided"]["structural_tag"])["type"] == "structural_tag"
    assert read[3]["guided"]["grammar"] == completions[3]["structured_outputs"]["grammar"]
    assert read[2]["reasoning_ended"] is True and read[3]["reasoning_ended"] is True


def stream_shape(lines: list[str]) -> list[Any]:
    """A completion stream's shape: each chunk's keys and its choice's keys, where the finish and the ids are."""
    shape = []
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        choice = chunk["choices"][0] if chunk["choices"] else {}
        logprobs = choice.get("logprobs") or {}
        shape.append((sorted(chunk), sorted(choice), bool(choice.get("token_ids")), sorted(logprobs),
                      sorted({token.partition(":")[0] for token in logprobs.get("tokens", ())}),
                      choice.get("finish_reason"), choice.get("prompt_token_ids") is not None,
                      sorted(chunk.get("usage") or {}), sorted((chunk.get("usage") or {}).get("prompt_tokens_details")
                                                               or {})))
    return shape


def test_the_fake_streams_what_vllm_streams(serve_app: Callable[[Any], LiveServer], vocab: Vocab,
                                           vllm: VllmServer) -> None:
    """The same body to the real vLLM and to the fake: chunks of the same keys, the finish on the last token's chunk,
    the generated ids in logprobs and no prompt ids, a usage chunk (cached_tokens: vLLM runs with
    --enable-prompt-tokens-details). With logprobs, vLLM sends the 4 tokens in fewer chunks than 4 at times (one
    of two, say): the chunks' kinds are compared, in order, and the ids counted."""
    prompt = vocab.encode_harmony("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    body = {"prompt": prompt, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
            "stop_token_ids": list(vocab.stop_token_ids), "seed": 5, **FLAVORS["vllm"]}
    shapes, ids = [], []
    for url, model in ((vllm.base_url, vllm.model), (serve_app(fake_upstream(vocab, "vllm", ANSWER)).base_url + "/v1",
                                                     MODEL)):
        with httpx.stream("POST", url + "/completions", json={**body, "model": model}, timeout=60) as response:
            lines = list(response.iter_lines())
        shapes.append(list(dict.fromkeys(json.dumps(shape) for shape in stream_shape(lines))))  # kinds, in order
        ids.append(sum(len((json.loads(line[6:])["choices"] or [{}])[0].get("logprobs", {}).get("tokens", ()))
                       for line in lines if line.startswith("data: {")))
    real, fake = shapes
    assert ids == [4, 4] and json.loads(real[-2])[5] == "length"  # the finish on the last token's chunk, then usage
    assert fake == real


def generate_shape(lines: list[str]) -> list[Any]:
    """A token-only stream's shape: each chunk's keys and its choice's, where the ids and the finish are, the
    usage's keys."""
    shape = []
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        choice = chunk["choices"][0] if chunk["choices"] else {}
        usage = chunk.get("usage") or {}
        shape.append((sorted(chunk), sorted(choice), len(choice.get("token_ids") or ()), choice.get("finish_reason"),
                      sorted(usage), sorted(usage.get("prompt_tokens_details") or {})))
    return shape


def test_the_fake_token_only_endpoint_streams_what_vllm_streams(serve_app: Callable[[Any], LiveServer],
                                                               vocab: Vocab, vllm: VllmServer) -> None:
    """The same body to the real vLLM's /inference/v1/generate (the session's runs --enable-scale-out) and to the
    fake's: chunks of the same keys, one id each, the finish on the last token's, no prompt ids, a usage chunk."""
    prompt = vocab.encode_harmony("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    request = GenerationRequest("shape-1", prompt, SamplingParams(max_tokens=4, stop_token_ids=vocab.stop_token_ids,
                                                                   seed=5))
    body = generate_body(request, vllm.model, None, False)
    fake = serve_app(fake_upstream(vocab, "vllm", ANSWER, token_endpoint="on"))
    shapes = []
    for root in (vllm.url, fake.base_url):
        with httpx.stream("POST", root + "/inference/v1/generate", json=body, timeout=60) as response:
            assert response.status_code == 200
            shapes.append(generate_shape(list(response.iter_lines())))
    real, fake_shape = shapes
    assert len(real) == 5 and real[3][3] == "length" and real[4][1] == []
    assert fake_shape == real
