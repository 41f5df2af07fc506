"""The floor for the load benchmark: bare Starlette + sse-starlette streaming chunks shaped like ours.

    .venv/bin/python benchmarks/bare_server.py --port 8001 [--tokens 400] [--tokens-per-step 1] [--step-ms 0]

Per POST /v1/chat/completions it reads the JSON body and streams `--tokens` tokens as `chat.completion.chunk`
frames of the same shape as harmony-proxy's, one frame per `--tokens-per-step` tokens and per
`await asyncio.sleep(step_ms / 1000)` (an engine step), each a dict encoded by the standard library's JSON encoder and
framed as `data: ...` bytes (as ours frames them; sse-starlette's `{"data": ...}` path costs ~15 us more per
frame here), sent by sse-starlette; then a finish chunk, a usage chunk when `stream_options.include_usage` is
set, and `data: [DONE]`. No tokenizer, no parser, no validation: the least a Python server built the usual
way does per streamed token.
GET /health answers 200. It runs under uvicorn with uvloop and httptools, as ours does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import uvicorn
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOKEN = " tok"
# json.dumps with ours' compact separators, minus the JSONEncoder that json.dumps builds per call for them:
# the same bytes as ours, at the cheapest the standard library gives.
to_json = json.JSONEncoder(separators=(",", ":")).encode


def frame(chunk: dict) -> bytes:
    return b"data: " + to_json(chunk).encode() + b"\n\n"


def create_app(tokens: int, tokens_per_step: int, step: float = 0.0) -> Starlette:
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        model = body.get("model", "openai/gpt-oss-20b")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return EventSourceResponse(chunks(model, include_usage), sep="\n", ping=15)

    async def chunks(model: str, include_usage: bool) -> AsyncIterator[bytes]:
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:29]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model}
        tail = {"usage": None} if include_usage else {}
        sent = 0
        while sent < tokens:
            await asyncio.sleep(step)  # one engine step
            count = min(tokens_per_step, tokens - sent)
            sent += count
            choice = {"index": 0, "delta": {"content": TOKEN * count}, "logprobs": None, "finish_reason": None}
            yield frame({**head, "choices": [choice], **tail})
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
        yield frame({**head, "choices": [choice], **tail})
        if include_usage:
            usage = {"prompt_tokens": 20, "completion_tokens": tokens, "total_tokens": 20 + tokens}
            yield frame({**head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ])


def main() -> None:
    options = argparse.ArgumentParser(description="bare Starlette + sse-starlette floor for benchmarks/load_bench.py")
    options.add_argument("--host", default="127.0.0.1")
    options.add_argument("--port", type=int, default=8001)
    options.add_argument("--tokens", type=int, default=400, help="tokens per stream")
    options.add_argument("--tokens-per-step", type=int, default=1, help="tokens per chunk")
    options.add_argument("--step-ms", type=float, default=0.0, help="sleep between chunks (an engine's pace)")
    args = options.parse_args()
    app = create_app(args.tokens, max(1, args.tokens_per_step), args.step_ms / 1000)
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level="warning",
                log_config=None)


if __name__ == "__main__":
    main()
