"""Token ids to a vLLM replica without its prompt's ids coming back: vLLM's token-only endpoint where it has one.

vLLM 0.32 serves `POST /inference/v1/generate` when started with `--tokens-only` or `--enable-scale-out`: token ids
in, token ids out, no detokenization in its API server (we ask `detokenize: false`; `--tokens-only` forces it), and
the prompt's ids only if asked (`return_token_ids`, which we never set). Its stream is `/v1/completions`' in shape
(`choices[].token_ids`, `finish_reason`, `stop_reason`, a last `usage` chunk with `cached_tokens`), so the upstream
engine reads both alike. `TokenEndpoints` finds which replicas serve it: one request each, from start-up on, that
vLLM's request validation answers before anything reaches its engine.

On `/v1/completions`, vLLM's `return_token_ids` also echoes the whole prompt's ids in the first chunk (~0.6 MB of
JSON for a 100k-token prompt) and nothing turns that off; `logprobs: 0` with `return_tokens_as_token_ids` carries
the generated ids alone, as `token_id:N` strings (`ids_from_logprobs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx

from proxy.engines.base import GenerationRequest

logger = logging.getLogger("harmony_proxy.engine")

GENERATE_PATH = "/inference/v1/generate"
# The `/v1/completions` fields that carry the generated ids, and no prompt ids, in vLLM's logprobs.
IDS_IN_LOGPROBS: dict[str, Any] = {"logprobs": 0, "return_tokens_as_token_ids": True}
_ID_PREFIX = "token_id:"
_RETRY_SECONDS = 5.0
_PROBE_TIMEOUT = 10.0


def server_root(url: str) -> str:
    """The server of an OpenAI base URL: `http://host:8000/v1` -> `http://host:8000` (a path prefix before `/v1`,
    as a gateway adds, is kept)."""
    return url.removesuffix("/v1")


class TokenEndpoints:
    """Which replicas serve vLLM's token-only endpoint. Each is asked once it answers, from start-up on (a replica
    still loading is asked again every few seconds); a request to a replica not known yet asks first."""

    def __init__(self, urls: list[str], enabled: bool = True) -> None:
        self._roots = [server_root(url) for url in urls]
        self._found: list[bool | None] = [None if enabled else False for _ in urls]
        self._attempts: list[asyncio.Task[bool | None] | None] = [None for _ in urls]
        self._watchers: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    def start(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self._watchers = [asyncio.create_task(self._watch(replica), name=f"token endpoint {root}")
                          for replica, root in enumerate(self._roots) if self._found[replica] is None]

    async def close(self) -> None:
        tasks = [*self._watchers, *(task for task in self._attempts if task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def known(self, replica: int) -> bool | None:
        """True: it serves the endpoint; False: it does not; None: not known yet."""
        return self._found[replica]

    async def serves_generate(self, replica: int) -> bool:
        """Whether to send this replica's requests to its token-only endpoint; asks it first if not known (a
        replica that cannot be asked now gets `/v1/completions`, which every vLLM serves)."""
        found = self._found[replica]
        if found is None:
            found = await self._attempt(replica)
        return bool(found)

    def refused(self, replica: int, status: int) -> None:
        """A replica answered a request with `status`: one that no longer has the token-only endpoint (restarted
        without it: 403, 404) is asked again before its next request."""
        if self._found[replica] and status in (403, 404, 405):
            self._found[replica] = None

    async def _watch(self, replica: int) -> None:
        while await self._attempt(replica) is None:
            await asyncio.sleep(_RETRY_SECONDS)

    async def _attempt(self, replica: int) -> bool | None:
        """One probe of the replica, shared by everyone waiting for it."""
        task = self._attempts[replica]
        if task is None or task.done():
            task = self._attempts[replica] = asyncio.create_task(self._probe(replica))
        return await asyncio.shield(task)

    async def _probe(self, replica: int) -> bool | None:
        """POST an empty body: vLLM's request validation answers 400 naming the missing `token_ids`, before any
        work; 403 where the endpoint is off (no --enable-scale-out), 404 where there is none."""
        if self._found[replica] is not None:
            return self._found[replica]
        assert self._client is not None
        root = self._roots[replica]
        try:
            response = await self._client.post(root + GENERATE_PATH, json={}, timeout=_PROBE_TIMEOUT)
        except httpx.HTTPError:
            return None
        with contextlib.suppress(httpx.HTTPError):
            await response.aread()
        if response.status_code in (400, 422) and b"token_ids" in response.content:
            found = True
            logger.info("%s serves vLLM's token-only endpoint: requests go to %s (token ids in and out)", root,
                        GENERATE_PATH)
        elif response.status_code in (403, 404, 405):
            found = False
            off = " (vLLM has it, off: start vLLM with --enable-scale-out to use it)" if response.status_code == 403 \
                else ""
            logger.info("%s has no token-only endpoint%s: requests go to its /v1/completions", root, off)
        else:
            return None  # a server error, or our key refused: ask again later
        self._found[replica] = found
        return found


def generate_body(request: GenerationRequest, model: str, structured: dict[str, Any] | None, whole_grammar: bool,
                  ) -> dict[str, Any]:
    """The `/inference/v1/generate` request: the prompt's ids, our sampling and stop tokens, and a constraint in
    vLLM's `structured_outputs` (as the `vllm` flavor sends it to `/v1/completions`); `whole_grammar`: the
    constraint is the whole completion's grammar, not only the final answer's schema."""
    sampling: dict[str, Any] = {**request.sampling.request_fields(), "detokenize": False}
    body: dict[str, Any] = {
        "model": model,
        "token_ids": request.prompt_token_ids,
        "request_id": request.request_id,
        "stream": True,
        "stream_options": {"include_usage": True},
        "sampling_params": sampling,
    }
    if structured:
        sampling["structured_outputs"] = structured
        if whole_grammar:
            # Our grammar covers the whole completion, reasoning included: vLLM applies it from the first token
            # instead of asking its reasoning parser where the reasoning ends.
            body["reasoning_ended"] = True
    return body


def ids_from_logprobs(tokens: list[str]) -> list[int]:
    """The generated ids a `/v1/completions` choice asked with `IDS_IN_LOGPROBS` carries in `logprobs.tokens`;
    ValueError for anything but `token_id:N` strings."""
    ids = []
    for token in tokens:
        if not token.startswith(_ID_PREFIX):
            raise ValueError("a token of logprobs.tokens is not token_id:N")
        ids.append(int(token[len(_ID_PREFIX):]))
    return ids
