"""Fakes of other servers' streaming `/v1/completions`, as the upstream engine meets them.

- trtllm-serve (tensorrt_llm/serve/openai_protocol.py): unknown fields are a 400 with a flat error body;
  `detokenize: false` gives ids in `choices[0].token_ids` and empty text; the end token (`<|return|>`) is never in
  the ids; a stop token id is, with `include_stop_str_in_output`, and `stop_reason` names it.
- NVIDIA Dynamo (lib/llm/src/protocols/openai/completions.rs): unsupported fields are a 400; ids come in
  `nvext.completion_token_ids` when asked through `nvext.extra_fields`; errors are an `error` SSE event.
- text: a server that ignores `return_token_ids` (an older SGLang) and sends only text, special tokens spelled.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from parsers.vocab import Vocab

TRTLLM_FIELDS = {"model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p", "seed",
                 "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
                 "spaces_between_special_tokens", "detokenize", "stop", "top_k"}
DYNAMO_FIELDS = {"model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p", "seed",
                 "ignore_eos", "min_tokens", "include_stop_str_in_output", "skip_special_tokens", "stop_token_ids",
                 "nvext", "stop"}


def fake_upstream(vocab: Vocab, flavor: str, completion: str, api_key: str | None = None,
                  fail_after: int | None = None) -> Starlette:
    seen: list[dict[str, Any]] = []

    async def completions(request: Request) -> Response:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "bad key", "type": "auth", "param": None, "code": 401}}, 401)
        body = await request.json()
        seen.append(body)
        allowed = {"trtllm": TRTLLM_FIELDS, "dynamo": DYNAMO_FIELDS}.get(flavor)
        if allowed is not None and set(body) - allowed:
            extra = sorted(set(body) - allowed)
            if flavor == "trtllm":
                return JSONResponse({"object": "error", "message": f"Extra inputs are not permitted: {extra}",
                                     "type": "BadRequestError", "param": None, "code": 400}, 400)
            return JSONResponse({"error": {"message": f"Unsupported parameter(s): {extra}"}}, 400)
        return StreamingResponse(_chunks(vocab, flavor, completion, body, fail_after), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "gpt-oss", "object": "model"}]})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/v1/models", models)])
    app.state.seen = seen
    return app


async def _chunks(vocab: Vocab, flavor: str, completion: str, body: dict[str, Any],
                  fail_after: int | None) -> AsyncIterator[bytes]:
    tokens = vocab.encode_harmony(completion)
    stops = set(body.get("stop_token_ids") or ())
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body["model"]}
    emitted, finish, stop_reason = 0, "length", None
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
        yield _data({**head, "choices": [_choice(vocab, flavor, [token])],
                     **({"nvext": {"completion_token_ids": [token]}} if flavor == "dynamo" else {})})
        if finish == "stop":
            break
    yield _data({**head, "choices": [{**_choice(vocab, flavor, []), "finish_reason": finish, "stop_reason": stop_reason}]})
    usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": emitted,
             "total_tokens": len(body["prompt"]) + emitted, "prompt_tokens_details": {"cached_tokens": 64}}
    yield _data({**head, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def _choice(vocab: Vocab, flavor: str, tokens: list[int]) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": "" if flavor == "trtllm" else vocab.decode(tokens),
                              "logprobs": None, "finish_reason": None}
    if flavor == "trtllm":
        choice["token_ids"] = tokens
    return choice


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
