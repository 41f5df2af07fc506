"""Fakes of other servers' streaming `/v1/completions`, as the upstream engine meets them.

- vLLM 0.32 (vllm/entrypoints/openai/completion/protocol.py and serving.py; tests/test_vllm_protocol.py compares
  this fake's stream with the real one's): `return_token_ids` gives ids in `choices[0].token_ids`, the prompt's in
  the first chunk's `prompt_token_ids` (both null otherwise); `logprobs: 0` with `return_tokens_as_token_ids` gives
  `logprobs` with the ids as `token_id:N` in `tokens` (the fake's logprobs are made up); every choice has
  `stop_reason` (the stop token id, None for the end token `<|return|>`, which is gpt-oss's EOS); the finish rides
  on the last token's chunk; the usage chunk carries `system_fingerprint`, and `prompt_tokens_details.cached_tokens`
  only when vLLM runs with --enable-prompt-tokens-details; unknown request fields are ignored, not refused.
  `structured_outputs` holds exactly one of json / regex / choice / grammar / json_object / structural_tag, the
  structural tag as a JSON string.
- vLLM's token-only `/inference/v1/generate` (vllm/entrypoints/scale_out/token_in_token_out/; `token_endpoint`:
  "on" serves it, "off" answers 403 as vLLM without --enable-scale-out does, "loading" 503, None has no such
  route; `app.state.probes` counts the empty bodies it was sent): a body without
  `token_ids` is a 400 naming it; `sampling_params` carry the limits, stop token ids and `structured_outputs`; each
  chunk has `request_id`, `usage` (null), `output_mode` and one choice of `token_ids`, `finish_reason` and
  `stop_reason` (the finish on the last token's chunk), then a usage chunk with no choices; never the prompt's ids
  unless `return_token_ids`. tests/test_vllm_protocol.py compares its stream with the real one's.
- SGLang (python/sglang/srt/entrypoints/openai/protocol.py): the same ids; the stop token id in `matched_stop`,
  and in the ids only with `no_stop_trim`; one of `json_schema` (a string), `regex`, `ebnf`, or a
  `response_format` of type `structural_tag`.
- trtllm-serve (tensorrt_llm/serve/openai_protocol.py): unknown fields are a 400 with a flat error body;
  `detokenize: false` gives ids in `choices[0].token_ids` and empty text; the end token (`<|return|>`) is never in
  the ids; a stop token id is, with `include_stop_str_in_output`, and `stop_reason` names it. `response_format`
  is a `ResponseFormat` (extra keys forbidden) of type json / json_object / ebnf / structural_tag / ...
- NVIDIA Dynamo (lib/llm/src/protocols/openai/completions.rs, common_ext.rs): unsupported fields are a 400; ids come
  in `nvext.completion_token_ids` when asked through `nvext.extra_fields`; `guided_json` / `guided_grammar` at the
  top level; errors are an `error` SSE event.
- text: a server that ignores `return_token_ids` (an older SGLang) and sends only text, special tokens spelled.

A fake that receives a constraint checks it as the real server would (the field's shape, a 400 otherwise), then
checks that the completion it is scripted to stream is one the constraint allows, as a real engine under it
could only produce such: a Lark grammar is compiled with llguidance and run over the completion's tokens, a
JSON Schema is checked against the final answer. A structural tag needs xgrammar (and torch), so only its shape
is checked. A completion the constraint forbids is a 500 saying why.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import llguidance
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from parsers.vocab import Vocab
from tests.grammars import session_matchers

TRTLLM_FIELDS = {"model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p", "seed",
                 "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
                 "spaces_between_special_tokens", "detokenize", "stop", "top_k", "response_format"}
DYNAMO_FIELDS = {"model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p", "seed",
                 "ignore_eos", "min_tokens", "include_stop_str_in_output", "skip_special_tokens", "stop_token_ids",
                 "nvext", "stop", "guided_json", "guided_regex", "guided_grammar", "guided_choice",
                 "guided_decoding_backend"}
TRTLLM_FORMATS = {"text", "json", "json_schema", "json_object", "regex", "ebnf", "structural_tag"}
VLLM_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class Refusal(Exception):
    """What the fake server answers instead of a stream: a status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def fake_upstream(vocab: Vocab, flavor: str, completion: str, api_key: str | None = None,
                  fail_after: int | None = None, token_endpoint: str | None = None) -> Starlette:
    seen: list[dict[str, Any]] = []

    async def completions(request: Request) -> Response:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "bad key", "type": "auth", "param": None, "code": 401}}, 401)
        body = await request.json()
        seen.append(body)
        try:
            _check_fields(flavor, body)
            _check_constraint(vocab, flavor, body, completion)
        except Refusal as refusal:
            if flavor == "trtllm":
                return JSONResponse({"object": "error", "message": refusal.message, "type": "BadRequestError",
                                     "param": None, "code": refusal.status}, refusal.status)
            return JSONResponse({"error": {"message": refusal.message, "type": "BadRequestError",
                                           "param": None, "code": refusal.status}}, refusal.status)
        return StreamingResponse(_chunks(vocab, flavor, completion, body, fail_after), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "gpt-oss", "object": "model"}]})

    async def generate(request: Request) -> Response:
        app.state.probes += request.headers.get("content-length") == "2"  # `{}`: the upstream engine asking
        if app.state.token_endpoint == "loading":
            return JSONResponse({"error": {"message": "not ready", "code": 503}}, 503)
        if app.state.token_endpoint == "off":
            return JSONResponse({"error": {"message": "Scale-out endpoints are disabled. Restart vllm serve with "
                                           "--enable-scale-out to enable them.", "type": "PermissionDeniedError",
                                           "param": None, "code": 403}}, 403)
        body = await request.json()
        if not body.get("token_ids") or not isinstance(body.get("sampling_params"), dict):
            return JSONResponse({"error": {"message": "1 validation error: body.token_ids: Field required",
                                           "type": "Bad Request", "param": "body.token_ids", "code": 400}}, 400)
        seen.append(body)
        try:
            _check_constraint(vocab, "vllm", {"structured_outputs": body["sampling_params"].get("structured_outputs")},
                              completion)
        except Refusal as refusal:
            return JSONResponse({"error": {"message": refusal.message, "type": "BadRequestError", "param": None,
                                           "code": refusal.status}}, refusal.status)
        return StreamingResponse(_generate_chunks(vocab, completion, body), media_type="text/event-stream")

    routes = [Route("/v1/completions", completions, methods=["POST"]), Route("/v1/models", models)]
    if token_endpoint is not None:
        routes.append(Route("/inference/v1/generate", generate, methods=["POST"]))
    app = Starlette(routes=routes)
    app.state.token_endpoint = token_endpoint  # a test may turn it "off" (a replica restarted without it)
    app.state.probes = 0
    app.state.seen = seen
    return app


def _check_fields(flavor: str, body: dict[str, Any]) -> None:
    allowed = {"trtllm": TRTLLM_FIELDS, "dynamo": DYNAMO_FIELDS}.get(flavor)
    if allowed is not None and set(body) - allowed:
        extra = sorted(set(body) - allowed)
        if flavor == "trtllm":
            raise Refusal(400, f"Extra inputs are not permitted: {extra}")
        raise Refusal(400, f"Unsupported parameter(s): {extra}")


def _check_constraint(vocab: Vocab, flavor: str, body: dict[str, Any], completion: str) -> None:
    """Refuse a malformed constraint field (400), or a scripted completion the constraint forbids (500)."""
    kind, value = guided_field(flavor, body)
    if kind == "lark":
        problem = lark_problem(vocab, value, completion)
    elif kind == "json_schema":
        problem = final_answer_problem(value, completion)
    else:
        problem = None
    if problem:
        raise Refusal(500, f"fake {flavor}: the scripted completion breaks the request's {kind}: {problem}")


def guided_field(flavor: str, body: dict[str, Any]) -> tuple[str | None, Any]:
    """The constraint a request carries, as (kind, value): kind is "lark", "json_schema", "structural_tag" or None.

    Raises Refusal(400) where the real server would refuse the field's shape."""
    if flavor == "vllm":
        return _vllm_field(body.get("structured_outputs"))
    if flavor == "sglang":
        return _sglang_field(body)
    if flavor == "trtllm":
        return _trtllm_field(body.get("response_format"))
    if flavor == "dynamo":
        found = [key for key in ("guided_json", "guided_grammar", "guided_regex", "guided_choice") if key in body]
        if len(found) > 1:
            raise Refusal(400, f"only one guided decoding option at a time: {found}")
        if "guided_grammar" in body:
            return "lark", _string(body["guided_grammar"], "guided_grammar")
        if "guided_json" in body:
            return "json_schema", _schema(body["guided_json"], "guided_json")
    return None, None


def _vllm_field(outputs: Any) -> tuple[str | None, Any]:
    if outputs is None:
        return None, None
    if not isinstance(outputs, dict) or set(outputs) - {*VLLM_CONSTRAINTS, "disable_any_whitespace",
                                                         "disable_additional_properties", "whitespace_pattern"}:
        raise Refusal(400, f"structured_outputs: not a StructuredOutputsParams: {outputs!r}")
    found = [key for key in VLLM_CONSTRAINTS if outputs.get(key) is not None]
    if len(found) != 1:
        raise Refusal(400, f"structured_outputs: exactly one kind of constraint, not {found}")
    if found == ["structural_tag"]:
        return "structural_tag", _structural_tag(json.loads(_string(outputs["structural_tag"], "structural_tag")))
    if found == ["grammar"]:
        return "lark", _string(outputs["grammar"], "grammar")
    if found == ["json"]:
        return "json_schema", _schema(outputs["json"], "structured_outputs.json")
    return found[0], outputs[found[0]]


def _sglang_field(body: dict[str, Any]) -> tuple[str | None, Any]:
    response_format = body.get("response_format")
    tagged = isinstance(response_format, dict) and response_format.get("type") == "structural_tag"
    found = [key for key in ("json_schema", "regex", "ebnf") if body.get(key) is not None] + (["tag"] if tagged else [])
    if len(found) > 1:
        raise Refusal(400, f"only one of regex, json_schema, ebnf or a structural tag: {found}")
    if tagged:
        return "structural_tag", _structural_tag(response_format)
    if body.get("ebnf") is not None:
        return "lark", _string(body["ebnf"], "ebnf")
    if body.get("json_schema") is not None:
        return "json_schema", _schema(json.loads(_string(body["json_schema"], "json_schema")), "json_schema")
    return None, None


def _trtllm_field(response_format: Any) -> tuple[str | None, Any]:
    if response_format is None:
        return None, None
    if not isinstance(response_format, dict) or response_format.get("type") not in TRTLLM_FORMATS:
        raise Refusal(400, f"response_format: not a ResponseFormat: {response_format!r}")
    extra = set(response_format) - {"type", "schema", "json_schema", "regex", "ebnf", "format"}
    if extra:
        raise Refusal(400, f"response_format: Extra inputs are not permitted: {sorted(extra)}")
    kind = response_format["type"]
    if kind == "structural_tag":
        return "structural_tag", _structural_tag(response_format)
    if kind == "ebnf":
        return "lark", _string(response_format.get("ebnf"), "response_format.ebnf")
    if kind == "json":
        return "json_schema", _schema(response_format.get("schema"), "response_format.schema")
    return kind, response_format


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Refusal(400, f"{name}: a non-empty string is required")
    return value


def _schema(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Refusal(400, f"{name}: a JSON Schema object is required")
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as exc:
        raise Refusal(400, f"{name}: not a valid JSON Schema: {exc.message}") from None
    return value


def _structural_tag(tag: Any) -> dict[str, Any]:
    """xgrammar's structural tag in its `format` form; the shape is all a fake without xgrammar can check."""
    if not isinstance(tag, dict) or tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), dict):
        raise Refusal(400, f"structural_tag: not a {{'type': 'structural_tag', 'format': ...}}: {tag!r}")
    if "type" not in tag["format"]:
        raise Refusal(400, "structural_tag: the format has no type")
    return tag


def lark_problem(vocab: Vocab, lark: str, completion: str) -> str | None:
    """Why llguidance, under this grammar, could not have generated `completion` (None when it could)."""
    matcher = llguidance.LLMatcher(session_matchers(vocab).tokenizer(), llguidance.LLMatcher.grammar_from_lark(lark),
                                   log_level=0)
    if matcher.is_error():
        return "the grammar does not compile: " + matcher.get_error()
    for token in vocab.encode_harmony(completion):
        if not matcher.consume_token(token):
            return f"{vocab.decode([token])!r} is not allowed there"
    return None if matcher.is_accepting() else "the completion stops before the grammar allows"


def final_answer_problem(schema: dict[str, Any], completion: str) -> str | None:
    """Why the final answer of `completion` does not satisfy `schema` (None when it does or there is none)."""
    _, found, body = completion.rpartition("<|channel|>final<|message|>")
    if not found:
        return None
    try:
        jsonschema.validate(json.loads(body.removesuffix("<|return|>")), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0]
    return None


async def _chunks(vocab: Vocab, flavor: str, completion: str, body: dict[str, Any],
                  fail_after: int | None) -> AsyncIterator[bytes]:
    tokens = vocab.encode_harmony(completion)
    stops = set(body.get("stop_token_ids") or ())
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body["model"]}
    emitted, finish, stop_reason = 0, "length", None
    stop_field = "matched_stop" if flavor == "sglang" else "stop_reason"
    held: dict[str, Any] | None = None  # vLLM: the last token's chunk, which carries the finish
    for token in tokens:
        if emitted >= body["max_tokens"]:
            break
        if fail_after is not None and emitted == fail_after:
            if flavor == "dynamo":
                yield b"event: error\n: the worker died\n\n"
            else:
                yield _data({"error": {"message": "the worker died", "type": "server_error", "code": 500}})
            return
        emitted += 1
        if token in stops:
            finish, stop_reason = "stop", (None if token == vocab.special.return_ else token)
            if flavor == "trtllm" and token == vocab.special.return_:
                break  # trtllm-serve leaves the end token out
            if flavor == "sglang":
                stop_reason = token  # SGLang names every stop token in `matched_stop`
                if not body.get("no_stop_trim"):
                    break  # and trims it from the output unless asked not to
        choice = _choice(vocab, flavor, [token])
        if flavor == "vllm":
            # vLLM: every chunk's choice has stop_reason, the first the prompt's ids (return_token_ids).
            echo = body.get("return_token_ids") and emitted == 1
            choice |= {"stop_reason": None, "prompt_token_ids": body["prompt"] if echo else None,
                       "logprobs": _vllm_logprobs(body, [token])}
            if not body.get("return_token_ids"):
                choice["token_ids"] = None
            if held is not None:
                yield _data(held)
            held = {**head, "choices": [choice]}
        else:
            yield _data({**head, "choices": [choice],
                         **({"nvext": {"completion_token_ids": [token]}} if flavor == "dynamo" else {})})
        if finish == "stop":
            break
    if held is not None:
        held["choices"][0] |= {"finish_reason": finish, "stop_reason": stop_reason}
        yield _data(held)
    else:
        yield _data({**head, "choices": [{**_choice(vocab, flavor, []), "finish_reason": finish,
                                          stop_field: stop_reason}]})
    usage: dict[str, Any] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": emitted,
                             "total_tokens": len(body["prompt"]) + emitted}
    usage["prompt_tokens_details"] = {"cached_tokens": 64}  # vLLM: only with --enable-prompt-tokens-details
    tail = {"system_fingerprint": "vllm-0.32.0-fake"} if flavor == "vllm" else {}
    yield _data({**head, "choices": [], "usage": usage, **tail})
    yield b"data: [DONE]\n\n"


def _choice(vocab: Vocab, flavor: str, tokens: list[int]) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": "" if flavor == "trtllm" else vocab.decode(tokens),
                              "logprobs": None, "finish_reason": None}
    if flavor in ("trtllm", "vllm", "sglang"):
        choice["token_ids"] = tokens
    return choice


async def _generate_chunks(vocab: Vocab, completion: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
    sampling = body["sampling_params"]
    stops = set(sampling.get("stop_token_ids") or ())
    head = {"request_id": f"generate-tokens-{body.get('request_id', '1')}", "usage": None, "output_mode": "tokens"}
    emitted, chunks = 0, []
    for token in vocab.encode_harmony(completion)[:sampling.get("max_tokens", 16)]:
        emitted += 1
        stop = token in stops and not sampling.get("ignore_eos")
        finish = "stop" if stop else ("length" if emitted == sampling.get("max_tokens", 16) else None)
        chunks.append({**head, "choices": [{"index": 0, "finish_reason": finish,
                                            "stop_reason": token if stop and token != vocab.special.return_ else None,
                                            "token_ids": [token], "routed_experts": None, "sampling_mask": None,
                                            "weight_versions": None, "logprobs": None}]})
        if stop:
            break
    if body.get("return_token_ids") and chunks:
        chunks[0]["prompt_token_ids"] = body["token_ids"]
    for chunk in chunks:
        yield _data(chunk)
    usage = {"prompt_tokens": len(body["token_ids"]), "total_tokens": len(body["token_ids"]) + emitted,
             "completion_tokens": emitted, "prompt_tokens_details": {"cached_tokens": 64}}
    yield _data({"request_id": head["request_id"], "usage": usage, "output_mode": "tokens", "choices": []})
    yield b"data: [DONE]\n\n"


def _vllm_logprobs(body: dict[str, Any], tokens: list[int]) -> dict[str, Any] | None:
    """vLLM's completion logprobs (`CompletionLogProbs`) of `tokens`, the sampled token's alone (`logprobs: 0`)."""
    if body.get("logprobs") is None:
        return None
    names = [f"token_id:{token}" if body.get("return_tokens_as_token_ids") else str(token) for token in tokens]
    return {"text_offset": [0] * len(tokens), "token_logprobs": [-1.0] * len(tokens), "tokens": names,
            "top_logprobs": [{name: -1.0} for name in names]}


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
