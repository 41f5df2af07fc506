"""The in-process vLLM engine: the AsyncLLM that the installed vLLM's own `vllm serve` start-up builds.

`serve.py` runs vLLM's own command-line handling; the engine client is then built from those arguments the way
`run_server` builds it (`vllm/entrypoints/launchers/api_server/entry.py`, `build_async_engine_client`:
`AsyncEngineArgs.from_cli_args`, `create_engine_config`, `AsyncLLM.from_vllm_config`), in a thread with no event
loop: that call waits for the engine core process to load the model, and AsyncLLM starts its output tasks on the
serving loop at the first request (its own comment: "so we can call __init__ before the event loop"). Meanwhile
the server answers /health with 503.

Requests go in as prompt token ids (`TokensPrompt`) with detokenization off; the generated ids come back as they
are (`RequestOutputKind.DELTA`). Sampling is converted by vLLM's own request model, as its `/v1/completions` does
(`CompletionRequest.to_sampling_params` with the model's generation-config defaults, `get_max_tokens`), from the
same fields the upstream `vllm` flavor sends over HTTP; output constraints travel in `structured_outputs`, in the
dialect of the grammar backend vLLM was started with (`--structured-outputs-config.backend`; `upstream_constraints`).
Closing a stream closes vLLM's `generate`, which aborts the request. KV-cache events (`--kv-events-config`) are
vLLM's to publish; `kv_event_sources` says where, as vLLM's own `/kv_event_sources` does.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import inspect
import itertools
import logging
import threading
from collections.abc import AsyncGenerator
from typing import Any

from parsers.vocab import Vocab
from proxy.engines.base import ContextWindow, EngineError, FinishReason, GenerationRequest, Step, Usage
from proxy.engines.upstream.constraints import GuidedDecoding
from proxy.engines.vllm.serve import parse_vllm_serve

logger = logging.getLogger("harmony_proxy.engine")

_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}
# vLLM's `--structured-outputs-config.backend` -> the dialect harmony-proxy writes the whole completion's grammar in.
# `auto` validates a request with xgrammar first and keeps it when xgrammar takes it: the structural tag.
_GRAMMAR_DIALECT = {"xgrammar": "xgrammar", "auto": "xgrammar", "guidance": "llguidance"}


class VllmEngine:
    name = "vllm"

    def __init__(self, command: list[str], vocab: Vocab) -> None:
        """`command`: a `vllm serve` command line, less `vllm serve`."""
        self._command = command
        self._vocab = vocab
        self.args: argparse.Namespace | None = None  # what vLLM's own `vllm serve` parsing made of the command
        self.context_window: ContextWindow | None = None
        self.kv_event_sources: dict[str, Any] | None = None  # as vLLM's own GET /kv_event_sources answers
        self.guided: GuidedDecoding | None = None
        self._client: Any = None  # vLLM's AsyncLLM
        self._loading: concurrent.futures.Future[Any] | None = None
        self._closing = False
        self._ids = itertools.count()
        self._defaults: dict[str, Any] = {}
        self._override_max_tokens: int | None = None
        self._request_model: Any = None
        self._max_tokens: Any = None
        self._client_errors: tuple[type[BaseException], ...] = (ValueError,)
        self._dead_error: type[BaseException] = RuntimeError
        self._gate = False  # whether this release's AsyncLLM.generate takes `reasoning_ended`

    @property
    def ready(self) -> bool:
        return self._client is not None and not self._closing

    @property
    def served_model_name(self) -> str | None:
        if self.args is None:
            return None
        names = self.args.served_model_name
        return names[0] if names else self.args.model

    def prepare(self) -> argparse.Namespace:
        """vLLM's own parsing and validation of the command (its errors raise here, before anything is served)."""
        if self.args is None:
            self.args = parse_vllm_serve(self._command)
        return self.args

    def load(self) -> None:
        """Build the engine client in the calling thread (the engine host process's main thread, before its loop)."""
        self._attach(self._build())

    def begin_loading(self) -> None:
        """Build the engine client in a side thread; `start()` waits for it. A daemon thread: a SIGTERM during the
        load must not wait for it."""
        built: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                client = self._build()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                built.set_exception(exc)
                return
            if self._closing:
                client.shutdown()  # the server stopped waiting for it
            built.set_result(client)

        self._loading = built
        threading.Thread(target=run, name="vllm-load", daemon=True).start()

    async def start(self) -> None:
        if self._client is not None:
            return  # built by load()
        if self._loading is None:
            await asyncio.to_thread(self.prepare)
            self.begin_loading()
        assert self._loading is not None
        self._attach(await asyncio.wrap_future(self._loading))

    def _build(self) -> Any:
        """`run_server`'s engine client, from the arguments vLLM's parsing made (no event loop runs here)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers import cli_args
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.prepare()
        engine_args = AsyncEngineArgs.from_cli_args(args)
        if hasattr(cli_args, "propagate_flash_late_interaction"):
            cli_args.propagate_flash_late_interaction(args, engine_args)
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        logger.info("loading %s with vLLM, as its `vllm serve` computed the arguments", config.model_config.model)
        return AsyncLLM.from_vllm_config(
            vllm_config=config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            enable_log_requests=engine_args.enable_log_requests,
            aggregate_engine_logging=engine_args.aggregate_engine_logging,
            disable_log_stats=engine_args.disable_log_stats,
        )

    def _attach(self, client: Any) -> None:
        import vllm
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        model = client.model_config
        # What vLLM's OpenAIServingCompletion computes once: the generation config's defaults, and its max tokens.
        self._defaults = model.get_diff_sampling_param()
        generation_config = getattr(model, "generation_config", "auto")
        self._override_max_tokens = (self._defaults.get("max_tokens") if generation_config not in ("auto", "vllm")
                                     else (getattr(model, "override_generation_config", None) or {}).get(
                                         "max_new_tokens"))
        self._request_model, self._max_tokens = CompletionRequest, get_max_tokens
        self._client_errors, self._dead_error = (VLLMClientError, ValueError, TypeError), EngineDeadError
        backend = str(client.vllm_config.structured_outputs_config.backend)
        dialect = _GRAMMAR_DIALECT.get(backend, "final-json")
        self.guided = GuidedDecoding("vllm", dialect)
        (logger.info if dialect != "final-json" else logger.warning)(
            "output constraints go to vLLM's %s grammar backend %s", backend,
            "as the whole completion's grammar" if dialect != "final-json" else
            "as the final answer's JSON Schema only: required and named tool calls and strict tool arguments are "
            "NOT enforced (use --structured-outputs-config.backend guidance or xgrammar)")
        self.context_window = ContextWindow(model.max_model_len, model.max_model_len - 1)  # one token to generate
        self.kv_event_sources = _sources(client.get_kv_event_sources())
        self._gate = "reasoning_ended" in inspect.signature(client.generate).parameters
        self._client = client
        logger.info("vLLM %s serving %s: prompt plus output up to %d tokens", vllm.__version__,
                    self.served_model_name, model.max_model_len)

    async def check_health(self) -> None:
        if self._closing or self._client is None:
            raise EngineError("The vLLM engine is not serving.", status=503, code="engine_unavailable")
        try:
            await self._client.check_health()
        except self._dead_error as exc:
            raise EngineError(f"The vLLM engine is dead: {exc}", status=503, code="engine_dead") from None

    async def close(self) -> None:
        self._closing = True
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.shutdown)
            logger.info("vLLM engine shut down")

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        if self._client is None or self._closing:
            raise EngineError("The vLLM engine is not serving.", status=503, code="engine_unavailable")
        prompt = request.prompt_token_ids
        params = self._sampling_params(request)
        # The grammar is the whole completion's, reasoning included: applied from the first token, whatever the
        # reasoning parser vLLM set for gpt-oss would gate (AsyncLLM.generate's `reasoning_ended`, 0.32 on).
        gate = {"reasoning_ended": True} if params.structured_outputs is not None and self._gate else {}
        # A request id vLLM has not seen: a tool loop generates several times under one of ours.
        stream = self._client.generate({"prompt_token_ids": prompt}, params, f"{request.request_id}-{next(self._ids)}",
                                       **gate)
        generated, last = 0, None
        try:
            async for output in stream:
                completion = output.outputs[0]
                tokens = list(completion.token_ids)
                generated += len(tokens)
                last = tokens[-1] if tokens else last
                if not output.finished:
                    if tokens:
                        yield Step(tokens)
                    continue
                reason = _FINISH.get(completion.finish_reason, "error")
                restored = self._restored_stop(last, completion.stop_reason, reason)
                usage = Usage(len(prompt), generated + len(restored), output.num_cached_tokens)
                yield Step(tokens + restored, reason, usage)
                return
        except self._client_errors as exc:
            raise EngineError(f"vLLM rejected the request: {exc}", status=400,
                              code="context_length_exceeded" if "maximum model length" in str(exc) else None) from exc
        except self._dead_error as exc:
            raise EngineError(f"The vLLM engine is dead: {exc}", status=503, code="engine_dead") from exc
        finally:
            await stream.aclose()  # vLLM's generate aborts the request when closed before it finished

    def _sampling_params(self, request: GenerationRequest) -> Any:
        """vLLM's SamplingParams for this request, converted by its own request model from the fields the upstream
        `vllm` flavor sends (the prompt is not among them: it goes to the engine as token ids)."""
        assert self.guided is not None
        guided, unenforced = self.guided.fields(request.constraint)
        if unenforced:
            logger.warning("request %s: vLLM's grammar backend does not enforce: %s", request.request_id, unenforced)
        try:
            body = self._request_model(model=self.served_model_name, prompt=[0], stream=True,
                                       skip_special_tokens=False, include_stop_str_in_output=True,
                                       **request.sampling.request_fields(), **guided)
            max_tokens = self._max_tokens(self.context_window.total if self.context_window else 0, body.max_tokens,
                                          len(request.prompt_token_ids), self._defaults, self._override_max_tokens)
            params = body.to_sampling_params(max_tokens, self._defaults)
        except ValueError as exc:  # pydantic's ValidationError is one; get_max_tokens raises one for a long prompt
            code = "context_length_exceeded" if "context length" in str(exc) else None
            raise EngineError(f"vLLM rejected the request: {exc}", status=400, code=code) from None
        params.detokenize = False  # token ids out: harmony-proxy's parser reads them
        return params

    def _restored_stop(self, last: int | None, stop_reason: Any, reason: FinishReason) -> list[int]:
        """The Harmony stop token that ended a `stop` finish, should the output leave it out."""
        stops = self._vocab.stop_token_ids
        if reason != "stop" or last in stops:
            return []
        if isinstance(stop_reason, int) and stop_reason in stops:
            return [stop_reason]
        return [self._vocab.special.return_] if stop_reason is None else []


def _sources(sources: dict[int, Any]) -> dict[str, Any]:
    """vLLM's KV-event publisher configuration per data-parallel rank, as its `/kv_event_sources` writes it."""
    written = {}
    for rank, config in sources.items():
        written[str(rank)] = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(vars(config))
    return written


def loaded_vllm_engine(command: list[str]) -> VllmEngine:
    """A VllmEngine with its engine client built in the calling thread: the `build` an engine host process runs.

    Module-level and taking plain data, so it can be handed to a spawned process (functools.partial)."""
    from parsers.vocab import load_vocab

    engine = VllmEngine(command, load_vocab())
    engine.load()
    return engine
