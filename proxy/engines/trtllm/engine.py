"""The in-process TensorRT-LLM engine: the LLM that the installed trtllm-serve builds, served by harmony-proxy.

trtllm-serve's own code runs (`serve.py`: its flags, defaults, YAML and precedence, whatever the release),
and this engine takes the LLM it built in place of its HTTP server. Against the LLM API of every release from the
gpt-oss-dev container to 2026 main (tensorrt_llm/llmapi/llm.py, executor/result.py):
- `generate_async(prompt_token_ids, sampling_params, streaming=True)` is a plain method called on the event
  loop thread; the `RequestOutput` it returns is async-iterated and yields the same object, mutated, each
  step. `outputs[0].token_ids_diff` holds the step's new tokens (several with `stream_interval` > 1).
- The end token (`<|return|>`, the tokenizer's EOS) never appears in `token_ids`: the engine puts the Harmony
  stop token back from `finish_reason`/`stop_reason`, because the parser must see `<|return|>` and `<|call|>`.
- `abort()` cancels a request (it then finishes `cancelled`); `shutdown()` stops the engine and its workers.
- `RequestOutput.cached_tokens` (PR #7637, 1.2.0rc1 on) is read where present; the KV-cache events
  (`get_kv_cache_events_async`), where the release has them and the LLM arguments turn them on, are published as
  vLLM publishes its own, one ZMQ publisher per attention data-parallel rank, listed by `kv_event_sources`
  (`kv_cache_events.py`, `kv_event_publisher.py`): routers in front of several replicas follow them.
- `reasoning_parser` is taken out of the LLM arguments: harmony-proxy parses Harmony itself, and from 2026 the
  LLM adds a thinking-budget logits processor to every request's sampling for it (llm.py id 55216765702).
- An LLM built and then not served (a failure while attaching it) is shut down.
Sampling and guided decoding: `harmony.py`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import AsyncGenerator
from typing import Any

from parsers.vocab import Vocab
from proxy.engines.base import ContextWindow, EngineError, FinishReason, GenerationRequest, Step, Usage
from proxy.engines.trtllm.harmony import (
    GuidedDecoding,
    context_window,
    guided_decoding,
    installed_version,
    sampling_params,
)
from proxy.engines.trtllm.kv_cache_events import KvCacheEvents, kv_cache_events
from proxy.engines.trtllm.kv_event_publisher import RankPublishers
from proxy.engines.trtllm.serve import ServeCall, run_trtllm_serve

logger = logging.getLogger("harmony_proxy.engine")

_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "cancelled",
    "timeout": "error",
    None: "stop",
}
_TOO_LONG = ("max_num_tokens", "max_seq_len", "should not exceed")
GUIDED_DECODING_BACKENDS = ("llguidance", "xgrammar", "none")


class TrtllmEngine:
    name = "trtllm"

    def __init__(self, command: list[str], vocab: Vocab, guided_decoding_backend: str | None = None,
                 events_host: str = "127.0.0.1") -> None:
        """`command`: a trtllm-serve command line, less `trtllm-serve serve`; `guided_decoding_backend`, when
        given, replaces the LLM argument of that name (`none` removes it); `events_host`: where KV-cache events
        are published (the address the server listens on)."""
        self._command = command
        self._publishers = RankPublishers(events_host)  # the KV-cache events', one per attention-DP rank
        self._following: asyncio.Task[None] | None = None
        self._vocab = vocab
        self._guided_backend = guided_decoding_backend
        self._llm: Any = None
        self.call: ServeCall | None = None  # what trtllm-serve handed to launch_server
        self.context_window: ContextWindow | None = None  # from the built LLM's own arguments
        self.kv_events: KvCacheEvents | None = None
        self._guided = GuidedDecoding(None, reason="not started")
        self._protocol: Any = None
        self._guided_params: Any = None
        self._request_error: type[Exception] = RuntimeError
        self._loading: concurrent.futures.Future[Any] | None = None
        self._closing = False
        self._active: set[Any] = set()  # RequestOutputs still streaming, aborted at shutdown

    @property
    def ready(self) -> bool:
        return self._llm is not None and not self._closing

    @property
    def served_model_name(self) -> str | None:
        return self.call.served_model_name if self.call else None

    @property
    def kv_event_sources(self) -> dict[str, dict[str, Any]] | None:
        """Each rank's publisher, as vLLM's `/kv_event_sources` lists them; None when nothing is published."""
        return self._publishers.sources()

    @property
    def vocab_size(self) -> int:
        """Token ids from 0 to this, less one (the engine host refuses others: host.py)."""
        return self._vocab.vocab_size

    async def check_health(self) -> None:
        if self._closing:
            raise EngineError("The TensorRT-LLM engine is shutting down.", status=503, code="engine_shutting_down")

    def load(self) -> None:
        """Run trtllm-serve in the calling thread, building the LLM: what the engine host process's main thread
        does (`proxy/engines/host.py`), as trtllm-serve does: TensorRT-LLM's MPI start-up assumes the main thread."""
        self._attach(run_trtllm_serve(self._command, self._adopt))

    def prepare(self) -> ServeCall:
        """Start trtllm-serve in a side thread and return once it has computed the LLM arguments (raising its
        errors); the LLM then builds while the server answers /health with 503, and `start()` waits for it.

        A daemon thread: a SIGTERM during the load (minutes) must not wait for it."""
        computed: concurrent.futures.Future[ServeCall] = concurrent.futures.Future()
        built: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def on_call(call: ServeCall) -> None:  # again if trtllm-serve is run again (a taken port)
            self._adopt(call)
            if not computed.done():
                computed.set_result(call)

        def run() -> None:
            try:
                llm = run_trtllm_serve(self._command, on_call)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                if not computed.done():
                    computed.set_exception(exc)
                built.set_exception(exc)
                return
            if self._closing:
                llm.shutdown()  # the server stopped waiting for it
            built.set_result(llm)

        self._loading = built
        threading.Thread(target=run, name="trtllm-load", daemon=True).start()
        return computed.result()

    async def start(self) -> None:
        if self._llm is None:  # else loaded by load()
            if self._loading is None:
                await asyncio.to_thread(self.prepare)  # trtllm-serve's parsing: quick, but not on the event loop
            assert self._loading is not None
            self._attach(await asyncio.wrap_future(self._loading))
        if self.kv_events is not None and self._following is None:
            self._following = asyncio.create_task(self.kv_events.follow(), name="trtllm kv-cache events")

    def _adopt(self, call: ServeCall) -> None:
        """trtllm-serve's LLM arguments, before the LLM is built: the one change harmony-proxy may make is the
        guided decoding backend its own flag names; the guided decoding form follows from them."""
        self.call = call
        arguments = call.llm_args
        if arguments.get("reasoning_parser") is not None:
            del arguments["reasoning_parser"]
            logger.info("reasoning_parser: not given to the LLM (harmony-proxy parses Harmony itself; the LLM would "
                        "add its thinking-budget logits processor to every request)")
        if self._guided_backend is not None:
            arguments.pop("guided_decoding_backend", None)
            if self._guided_backend != "none":
                arguments["guided_decoding_backend"] = self._guided_backend
            logger.info("guided_decoding_backend: %s (--guided-decoding-backend)", self._guided_backend)
        import tensorrt_llm

        self._guided = guided_decoding(arguments.get("guided_decoding_backend"), installed_version("xgrammar"),
                                       bool(arguments.get("speculative_config")), tensorrt_llm.__version__)
        (logger.info if self._guided.field else logger.warning)("%s", self._guided.message)
        logger.info("loading %s with TensorRT-LLM %s, as its trtllm-serve computed the arguments", arguments["model"],
                    tensorrt_llm.__version__)

    def _attach(self, llm: Any) -> None:
        try:
            self._adopt_llm(llm)
        except BaseException:
            self._publishers.close()
            llm.shutdown()  # built, and not to be served
            raise

    def _adopt_llm(self, llm: Any) -> None:
        import tensorrt_llm
        from tensorrt_llm.executor import RequestError
        from tensorrt_llm.llmapi import GuidedDecodingParams  # the stable path in every release
        from tensorrt_llm.serve import openai_protocol

        self._protocol, self._guided_params, self._request_error = openai_protocol, GuidedDecodingParams, RequestError
        self.context_window, source = context_window(llm)
        self.kv_events = kv_cache_events(llm, self._publishers.publish)
        args = llm.args  # attention data parallelism: a rank (its own cache) per tensor-parallel rank
        ranks = int(getattr(args, "tensor_parallel_size", 1) or 1) if getattr(args, "enable_attention_dp", False) else 1
        if self.kv_events is not None and not self._publishers.open(ranks):
            self.kv_events = None
        self._llm = llm
        (logger.warning if source.startswith("ASSUMED") else logger.info)(
            "TensorRT-LLM %s serving %s: prompts up to %d tokens, prompt plus output up to %d (%s)%s",
            tensorrt_llm.__version__, self.served_model_name, self.context_window.prompt, self.context_window.total,
            source, "" if self.context_window.prompt == self.context_window.total
            else "; --enable_chunked_prefill takes prompts up to the latter")

    async def close(self) -> None:
        self._closing = True
        for result in list(self._active):
            result.abort()
        if self._following is not None and not self._following.done():
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        self._publishers.close()
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()
            logger.info("TensorRT-LLM engine shut down")

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        if self._llm is None or self._closing:
            raise EngineError("The TensorRT-LLM engine is not serving.", status=503, code="engine_unavailable")
        result = self._submit(request)
        self._active.add(result)
        finished = False
        try:
            async for output in result:
                completion = output.outputs[0]
                tokens = list(completion.token_ids_diff)
                if not output.finished:
                    if tokens:
                        yield Step(tokens)
                    continue
                finished = True
                reason = _FINISH.get(completion.finish_reason, "error")
                restored = self._restored_stop(completion, reason)
                usage = Usage(
                    prompt_tokens=len(request.prompt_token_ids),
                    completion_tokens=len(completion.token_ids) + len(restored),
                    cached_tokens=getattr(output, "cached_tokens", None),  # PR #7637 (2025-10-16): 1.2 on
                )
                yield Step(tokens + restored, reason, usage)
                return
        except self._request_error as exc:
            raise EngineError(f"TensorRT-LLM failed the request: {exc}", status=500, code="engine_error") from exc
        finally:
            self._active.discard(result)
            if not finished:
                result.abort()  # the client left or the consumer stopped: free the engine's slot now

    def _submit(self, request: GenerationRequest) -> Any:
        window = self.context_window
        if window is not None and len(request.prompt_token_ids) > window.prompt:
            raise EngineError(
                f"The prompt has {len(request.prompt_token_ids)} tokens; this TensorRT-LLM engine takes at most "
                f"{window.prompt} (max_num_tokens without chunked prefill, else max_seq_len).",
                status=400, code="context_length_exceeded")
        try:
            params = sampling_params(self._protocol, request, self.served_model_name or "",
                                     self._guided.params(self._guided_params, request))
            return self._llm.generate_async(request.prompt_token_ids, sampling_params=params, streaming=True)
        except (self._request_error, ValueError, TypeError) as exc:
            message = str(exc)
            if self._closing or "shutting down" in message:
                raise EngineError("The TensorRT-LLM engine is shutting down.", status=503) from exc
            code = "context_length_exceeded" if any(marker in message for marker in _TOO_LONG) else None
            raise EngineError(f"TensorRT-LLM rejected the request: {message}", status=400, code=code) from exc
        except RuntimeError as exc:  # "LLM is shutting down"
            raise EngineError(f"The TensorRT-LLM engine is not serving: {exc}", status=503) from exc

    def _restored_stop(self, completion: Any, reason: FinishReason) -> list[int]:
        """The Harmony stop token that ended a `stop` finish, when TensorRT-LLM left it out of token_ids."""
        stops = self._vocab.stop_token_ids
        if reason != "stop" or (completion.token_ids and completion.token_ids[-1] in stops):
            return []
        stop_reason = completion.stop_reason
        if isinstance(stop_reason, int) and stop_reason in stops:
            return [stop_reason]
        return [self._vocab.special.return_] if stop_reason is None else []  # None: the end token, <|return|>


def loaded_trtllm_engine(command: list[str], guided_decoding_backend: str | None = None,
                        events_host: str = "127.0.0.1") -> TrtllmEngine:
    """A TrtllmEngine with its LLM built in the calling thread: the `build` an engine host process runs.

    Module-level and taking plain data, so it can be handed to a spawned process (functools.partial).
    """
    from parsers.vocab import load_vocab

    engine = TrtllmEngine(command, load_vocab(), guided_decoding_backend, events_host)
    engine.load()
    return engine
