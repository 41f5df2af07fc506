"""A fast upstream for `load_bench.py --upstream-canned`: the script's completion as pre-built `/v1/completions` chunks.

    python benchmarks/canned_upstream.py --port 8001 --script script.jsonl [--batch 4] [--step-ms 0]

On a machine of two cores a harmony-proxy upstream (`load_bench.py --upstream`) shares a core with the clients and
streams slower than the front end reads: the front end waits on it, and what is measured is the upstream. This
server costs next to nothing per token, so the front end is the one that is saturated, as in front of a GPU fleet.
It answers `POST /v1/completions` as harmony-proxy does for the upstream engine's `vllm` flavor (one token a
chunk, its id in `logprobs.tokens` as `token_id:N`, then the finish, the usage and `[DONE]`; the same bytes for
every request), each event an HTTP chunk (as uvicorn and vLLM send them), `--batch` events a write, one write per
stream per turn of its event loop (with `--step-ms P`, one every P ms), and stops writing while its transport is
paused (TCP back-pressure from a front end that does not read). `POST /inference/v1/generate` is 404 (no
token-only endpoint); `GET /health` and `/v1/models` are 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsers.vocab import load_vocab

MODEL = "openai/gpt-oss-20b"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"


def events(script: Path, prompt_tokens: int = 100) -> list[bytes]:
    """The SSE events of the script's first completion, in harmony-proxy's `/v1/completions` shape."""
    vocab = load_vocab()
    tokens = vocab.encode_harmony(json.loads(script.read_text(encoding="utf-8").splitlines()[0])["completion"])
    base = {"id": "cmpl-0123456789abcdef0123456789abc", "object": "text_completion", "created": 1764662400,
            "model": MODEL}
    chunks = [{**base, "choices": [{"index": 0, "text": vocab.decode([token]),
                                    "logprobs": {"tokens": [f"token_id:{token}"], "token_logprobs": [None]},
                                    "finish_reason": None}]} for token in tokens]
    chunks.append({**base, "choices": [{"index": 0, "text": "", "logprobs": {"tokens": [], "token_logprobs": []},
                                        "finish_reason": "stop", "stop_reason": tokens[-1]}], "usage": None})
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                                                    "total_tokens": prompt_tokens + len(tokens)}})
    return [b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n" for chunk in chunks] + [
        b"data: [DONE]\n\n"]


def writes(lines: list[bytes], batch: int) -> list[bytes]:
    """The body, each event an HTTP chunk (as uvicorn and vLLM send them), `batch` events a write, then the last
    chunk."""
    chunks = [b"%x\r\n%s\r\n" % (len(line), line) for line in lines]
    out = [b"".join(chunks[start:start + batch]) for start in range(0, len(chunks), batch)]
    out[-1] += b"0\r\n\r\n"
    return out


class Upstream(asyncio.Protocol):
    def __init__(self, body: list[bytes], step: float) -> None:
        self.body, self.step = body, step
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.writable: asyncio.Event = asyncio.Event()
        self.writable.set()
        self.streaming: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = next((int(line.split(":", 1)[1]) for line in head[1:]
                           if line.lower().startswith("content-length:")), 0)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            method, path = head[0].split(" ")[:2]
            self.answer(method, path)

    def answer(self, method: str, path: str) -> None:
        assert self.transport is not None
        if method == "POST" and path.endswith("/v1/completions"):
            self.streaming = asyncio.ensure_future(self.stream())
        elif method == "GET" and path in ("/health", "/v1/models"):
            body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(body), body))
        else:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

    async def stream(self) -> None:
        assert self.transport is not None
        self.transport.write(HEAD)
        for data in self.body:
            if not self.writable.is_set():
                await self.writable.wait()
            if self.transport.is_closing():
                return
            self.transport.write(data)
            await asyncio.sleep(self.step)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        if self.streaming is not None:
            self.streaming.cancel()


async def serve(port: int, body: list[bytes], step: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Upstream(body, step), "127.0.0.1", port, backlog=8192)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path, required=True, help="load_bench.py's script (its first completion)")
    parser.add_argument("--batch", type=int, default=4, help="events per write (default 4)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="ms between a stream's writes (default 0)")
    args = parser.parse_args()
    body = writes(events(args.script), args.batch)
    uvloop.run(serve(args.port, body, args.step_ms / 1000))


if __name__ == "__main__":
    main()
