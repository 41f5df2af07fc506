"""The upstream engine: prompt token ids to the `/v1/completions` of an existing gpt-oss deployment.

For users who outgrow one machine (a vLLM or trtllm-serve fleet, SGLang, NVIDIA Dynamo's disaggregated
cluster, another harmony-proxy) while keeping our Harmony handling. We send the rendered prompt as token ids,
streaming, with special tokens kept and the Harmony stop tokens included in the output, and read the
generated token ids back. Servers ask for token ids differently, and trtllm-serve and Dynamo reject fields
they do not know, so the request follows the upstream's flavor:

- `vllm` (vLLM, harmony-proxy): vLLM's token-only `/inference/v1/generate` where a replica serves it, else
  `logprobs: 0` with `return_tokens_as_token_ids`, ids in `choices[0].logprobs.tokens` (`generate.py`:
  `return_token_ids` would echo the whole prompt's ids);
- `sglang` (SGLang): `return_token_ids`, ids in `choices[0].token_ids`, with `no_stop_trim` (SGLang's name for
  keeping the stop token); SGLang echoes the prompt's ids too, and its OpenAI API has no other way to the ids;
- `trtllm` (trtllm-serve): `detokenize: false`, ids in `choices[0].token_ids`;
- `dynamo` (NVIDIA Dynamo): `nvext.extra_fields: ["completion_token_ids"]`, ids in `nvext.completion_token_ids`.

When a chunk carries no ids, its text is encoded with every special token allowed: the text is the same, but
token boundaries (and so per-token timing) can differ from what the model generated. Servers leave the final
`<|return|>` out of the ids at times; it is put back from `finish_reason` and `stop_reason`.

Output constraints (a required call, strict arguments, a JSON final answer) travel in the flavor's own guided
decoding field, in the dialect of the upstream's grammar backend: see `GuidedDecoding`.

The token stream travels over `http.py` (a lean HTTP/1.1 client, no pool limit of its own: admission
bounds the requests in flight) and is decoded by `chunks.py`; httpx serves the rest (health probes, the
replicas' KV-event sources).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from http import HTTPStatus
from typing import Any

import httpx
import msgspec

from parsers.vocab import Vocab
from proxy.engines.base import EngineError, FinishReason, GenerationRequest, Step, Usage
from proxy.engines.upstream.chunks import Choice, Chunk, ChunkError, EventReader, UpstreamFailed, decode, error_text
from proxy.engines.upstream.constraints import GuidedDecoding
from proxy.engines.upstream.generate import (
    GENERATE_PATH,
    IDS_IN_LOGPROBS,
    TokenEndpoints,
    generate_body,
    ids_from_logprobs,
    server_root,
)
from proxy.engines.upstream.http import ConnectionPool, Origin, StreamEnded, UpstreamConnection, UpstreamHTTPError
from proxy.engines.upstream.kv_events import ReplicaBlocks
from proxy.engines.upstream.kv_subscriber import EventBudget, EventCounts, EventSubscriber
from proxy.engines.upstream.routing import Route, Router, make_router

logger = logging.getLogger("harmony_proxy.engine")

FLAVORS: dict[str, dict[str, Any]] = {
    "vllm": {**IDS_IN_LOGPROBS, "skip_special_tokens": False, "include_stop_str_in_output": True},
    "sglang": {"return_token_ids": True, "skip_special_tokens": False, "no_stop_trim": True},
    "trtllm": {"detokenize": False, "skip_special_tokens": False, "include_stop_str_in_output": True},
    "dynamo": {
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "nvext": {"extra_fields": ["completion_token_ids"]},
    },
}
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "cancelled",
    "cancelled": "cancelled",
    "content_filter": "stop",
    "timeout": "error",
}
_RETRY_STATUSES = (408, 429, 502, 503, 504)  # an upstream that is down, overloaded or slow: try the next one
_CLIENT_STATUSES = (400, 413, 422)  # the request itself is wrong (too long, say): the client should know

class UpstreamEngine:
    name = "upstream"

    def __init__(
        self,
        vocab: Vocab,
        urls: list[str],
        model: str,
        flavor: str = "vllm",
        api_key: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        guided_decoding: str | None = None,
        routing: str = "cache-aware",
        kv_events: bool = True,
        kv_events_budget: EventBudget | None = None,
        kv_events_bind: tuple[str, ...] = (),
        max_in_flight: int | None = None,
        token_endpoint: bool = True,
    ) -> None:
        """`max_in_flight`: the requests admission lets run at once (None: no limit); it sizes what the pool of
        connections keeps per replica. Requests never wait for a connection."""
        if not urls:
            raise ValueError("the upstream engine needs at least one --upstream-url")
        self._vocab = vocab
        self._urls = [url.rstrip("/") for url in urls]
        self._origins = [Origin(url) for url in self._urls]
        self._roots = [Origin(server_root(url)) for url in self._urls]  # where vLLM serves /inference/v1/generate
        self._model = model
        self._fields = FLAVORS[flavor]
        # vLLM replicas serving /inference/v1/generate get their requests there (`token_endpoint`: tests of the
        # /v1/completions path turn it off).
        self._endpoints = TokenEndpoints(self._urls, enabled=flavor == "vllm" and token_endpoint)
        self.guided = GuidedDecoding(flavor, guided_decoding)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx only for probes and the KV-event sources: a handful of connections, never waited for long.
        self._timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout,
                                      pool=connect_timeout)
        self.max_in_flight = max_in_flight
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self.pool: ConnectionPool | None = None
        # Replicas that publish their KV-cache events are routed on what they really hold (found at start).
        self._held = [ReplicaBlocks() for _ in self._urls] if kv_events and len(self._urls) > 1 else []
        self.router: Router = make_router(routing, len(self._urls), self._held)
        self._client: httpx.AsyncClient | None = None
        self._kv_budget, self._kv_bind = kv_events_budget, kv_events_bind
        self._subscribers: list[EventSubscriber] = []

    @property
    def ready(self) -> bool:
        return self._client is not None

    async def start(self) -> None:
        logger.log(*self.guided.notice())
        # Connections to the upstreams are reused; as many kept per replica as admission lets run at once.
        self.pool = ConnectionPool(self._connect_timeout, self._read_timeout, self._headers, self.max_in_flight)
        self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
        self._subscribers = [EventSubscriber(_root(url), held, self._client, self._kv_budget, self._kv_bind)
                             for url, held in zip(self._urls, self._held, strict=False)]
        for subscriber in self._subscribers:
            subscriber.start()
        self._endpoints.start(self._client)

    def kv_event_counts(self) -> dict[str, tuple[EventCounts, int]]:
        """Per replica (with several, each followed for its KV-cache events): what became of its events, and the
        blocks it is believed to hold."""
        return {_public(url): (subscriber.counts, len(subscriber.view))
                for url, subscriber in zip(self._urls, self._subscribers, strict=False)}

    async def close(self) -> None:
        await self._endpoints.close()
        for subscriber in self._subscribers:
            await subscriber.close()
        if self.pool is not None:
            self.pool.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def check_health(self) -> None:
        problems = await asyncio.gather(*(self._probe(url) for url in self._urls))
        if all(problems):
            raise EngineError(
                "No upstream is reachable: " + "; ".join(problems), status=503, code="upstream_unavailable"
            )

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        response, route, replica = await self._open(self._body(request), request)
        url = self._urls[replica]
        done = False
        try:
            async for step in self._steps(response, url, request):
                if step.finish_reason is not None:
                    # The answer came whole and every line of it was taken: its connection is free before the
                    # client has the last step (and may come back at once for another).
                    done = True
                    self.router.finished(route, replica)
                    response.finish()
                yield step
        except UpstreamHTTPError as exc:
            raise EngineError(
                f"The upstream {_public(url)} failed while streaming: {exc}",
                status=502,
                code="upstream_error",
            ) from exc
        finally:
            if not done:
                self.router.finished(route, replica)
                response.finish()  # closing an unfinished stream is how the upstream learns to abort the request

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        guided, unenforced = self.guided.fields(request.constraint)
        if unenforced:
            logger.warning("request %s: the upstream (%s) does not enforce: %s", request.request_id,
                           self.guided.label, unenforced)
        return {
            "model": self._model,
            "prompt": request.prompt_token_ids,
            "stream": True,
            "stream_options": {"include_usage": True},
            **request.sampling.request_fields(),
            **self._fields,
            **guided,
        }

    async def _open(self, body: dict[str, Any], request: GenerationRequest) -> tuple[UpstreamConnection, Route, int]:
        """Send to the replica the router picks; fail over to the others, in its order, while nothing has been
        received. Returns the open stream, the routing decision and the replica's index."""
        if self.pool is None:
            raise EngineError("The upstream engine is not started.", status=503)
        route = self.router.route(request.prompt_token_ids, request.routing_hints)
        problems = []
        for replica in route.order:
            url = self._urls[replica]
            # In flight from now: a replica queueing prefills has not answered yet, and is busy all the same.
            self.router.sent(route, replica, request.request_id)
            try:
                origin, path, sent = await self._target(replica, body, request)
                response = await self.pool.post(origin, path, msgspec.json.encode(sent), dict(request.trace_headers))
            except UpstreamHTTPError as exc:
                self.router.finished(route, replica)
                problems.append(f"{_public(url)}: {exc}")
                continue
            except BaseException:
                self.router.finished(route, replica)
                raise
            if response.status == 200:
                return response, route, replica
            self.router.finished(route, replica)
            self._endpoints.refused(replica, response.status)
            message = await _error_message(response)
            if response.status in _RETRY_STATUSES:
                problems.append(f"{_public(url)}: HTTP {response.status} {message}")
                continue
            # Anything else (401, 403, 404, 500) is a problem between us and the upstream: a bad gateway.
            status = 400 if response.status in _CLIENT_STATUSES else 502
            raise EngineError(
                f"The upstream {_public(url)} refused the request (HTTP {response.status}): {message}",
                status=status,
                code="upstream_rejected",
            )
        logger.warning("no upstream could take a request: %s", "; ".join(problems))
        raise EngineError(
            "No upstream could take the request: " + "; ".join(problems), status=503, code="upstream_unavailable"
        )

    async def _target(self, replica: int, body: dict[str, Any], request: GenerationRequest,
                      ) -> tuple[Origin, str, dict[str, Any]]:
        """Where this replica takes the request (its origin and path), and the body it takes there."""
        if not await self._endpoints.serves_generate(replica):
            return self._origins[replica], "/completions", body
        whole = self.guided.mode in ("xgrammar", "llguidance")
        return self._roots[replica], GENERATE_PATH, generate_body(request, self._model, body.get("structured_outputs"),
                                                                  whole)

    async def _steps(self, response: UpstreamConnection, url: str,
                     request: GenerationRequest) -> AsyncIterator[Step]:
        stops = self._vocab.stop_token_ids
        finish: FinishReason | None = None
        stop_reason: Any = None
        usage: dict[str, Any] | None = None
        last_token: int | None = None
        generated = 0
        events = EventReader()
        # A step is what `next_lines` hands on: the chunks of at most STEP_BYTES, one step a turn of the event loop.
        while True:
            try:
                payloads = events.payloads(await response.next_lines())
                chunks = decode(payloads) if payloads else ()
            except StreamEnded:
                break
            except (ChunkError, UpstreamFailed) as exc:
                raise EngineError(f"The upstream {_public(url)} failed: {exc}" if isinstance(exc, UpstreamFailed)
                                  else f"The upstream {_public(url)} {exc}.", status=502,
                                  code="upstream_error") from None
            step: list[int] = []
            for chunk in chunks:
                if chunk.error is not msgspec.UNSET:
                    raise EngineError(f"The upstream {_public(url)} failed: {error_text(chunk.error)}",
                                      status=502, code="upstream_error")
                if chunk.usage:
                    usage = chunk.usage
                for choice in chunk.choices or ():
                    tokens = choice.token_ids
                    step += tokens if tokens is not None else self._untokenized(choice, chunk, url)
                    if choice.finish_reason:
                        finish = _FINISH.get(choice.finish_reason, "error")
                        stop_reason = choice.stop
            if not step:
                continue
            if min(step) < 0 or max(step) >= self._vocab.vocab_size:
                raise EngineError(f"The upstream {_public(url)} sent invalid token ids.", status=502,
                                  code="upstream_error")
            generated += len(step)
            last_token = step[-1]
            yield Step(step)
        if finish is None:
            raise EngineError(
                f"The upstream {_public(url)} ended the stream without finishing the request.",
                status=502,
                code="upstream_error",
            )
        restored: list[int] = []
        if finish == "stop" and last_token not in stops:
            if isinstance(stop_reason, int) and stop_reason in stops:
                restored = [stop_reason]
            elif stop_reason is None:
                restored = [self._vocab.special.return_]  # the end token, which servers may leave out
        yield Step(restored, finish, self._usage(usage, request, generated + len(restored)))

    def _untokenized(self, choice: Choice, chunk: Chunk, url: str) -> list[int]:
        """A choice without `token_ids`: the ids in its logprobs (vLLM's `return_tokens_as_token_ids`), Dynamo's
        ids, else its text encoded (special tokens allowed)."""
        if choice.logprobs is not None and choice.logprobs.tokens is not None:
            try:
                return ids_from_logprobs(choice.logprobs.tokens)
            except ValueError:
                raise EngineError(f"The upstream {_public(url)} sent invalid token ids.", status=502,
                                  code="upstream_error") from None
        if chunk.nvext is not None and chunk.nvext.completion_token_ids is not None:
            return chunk.nvext.completion_token_ids
        return self._vocab.encode_harmony(choice.text) if choice.text else []

    @staticmethod
    def _usage(usage: dict[str, Any] | None, request: GenerationRequest, generated: int) -> Usage:
        if not usage:
            return Usage(len(request.prompt_token_ids), generated)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return Usage(
            int(usage.get("prompt_tokens", len(request.prompt_token_ids))),
            int(usage.get("completion_tokens", generated)),
            int(cached) if cached is not None else None,
        )

    async def _probe(self, url: str) -> str:
        """'' when the upstream answers GET /models, else what went wrong."""
        assert self._client is not None
        try:
            response = await self._client.get(url + "/models", timeout=min(5.0, self._timeout.read or 5.0))
        except httpx.HTTPError as exc:
            return f"{_public(url)}: {_describe(exc)}"
        return "" if response.status_code == 200 else f"{_public(url)}: HTTP {response.status_code}"


async def _error_message(response: UpstreamConnection) -> str:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    try:
        body = json.loads(await response.read_body())
    except (json.JSONDecodeError, UpstreamHTTPError, UnicodeDecodeError):
        return reason
    if isinstance(body, dict):
        return error_text(body.get("error") or body.get("message") or body)  # trtllm-serve: a flat error object
    return reason


def _public(url: str) -> str:
    """The URL as it may be shown: scheme, host, port and path; no user:password, query or fragment."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def _describe(exc: httpx.HTTPError) -> str:
    kinds = {
        httpx.ConnectError: "connection failed",
        httpx.ConnectTimeout: "connection timed out",
        httpx.ReadTimeout: "no data before the read timeout",
        httpx.RemoteProtocolError: "the connection broke",
    }
    for kind, text in kinds.items():
        if isinstance(exc, kind):
            return text
    return type(exc).__name__


def _root(url: str) -> str:
    """The server a `/v1` base URL belongs to (where vLLM answers `/kv_event_sources`)."""
    parts = httpx.URL(url)
    return str(parts.copy_with(path="/", query=None, fragment=None)).rstrip("/")
