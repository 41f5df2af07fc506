"""The in-process TensorRT-LLM engine: one `tensorrt_llm.LLM` (PyTorch backend) in the server process.

Written against the LLM API of TensorRT-LLM 1.1 to 1.3 (tensorrt_llm/llmapi/llm.py, sampling_params.py,
executor/result.py):
- `LLM(**arguments)` loads the model; with tensor/expert parallelism it starts TensorRT-LLM's own MPI workers.
- `generate_async(prompt_token_ids, sampling_params, streaming=True)` is a plain method called on the event
  loop thread; the `RequestOutput` it returns is async-iterated and yields the same object, mutated, each
  step. `outputs[0].token_ids_diff` holds the step's new tokens (several with `stream_interval` > 1).
- Stop tokens are stripped from `token_ids` unless `include_stop_str_in_output=True`, and the end token
  (`<|return|>`, the tokenizer's EOS) never appears in them: the engine puts the Harmony stop token back from
  `finish_reason`/`stop_reason`, because the parser must see `<|return|>` and `<|call|>`.
- `abort()` cancels a request (it then finishes `cancelled`); `shutdown()` stops the engine and its workers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

from parsers.vocab import Vocab
from proxy.engines.base import EngineError, FinishReason, GenerationRequest, SamplingParams, Step, Usage

logger = logging.getLogger("harmony_proxy.engine")

_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "cancelled",
    "timeout": "error",
    None: "stop",
}
_TOO_LONG = ("max_num_tokens", "max_seq_len", "should not exceed")


class TrtllmEngine:
    name = "trtllm"

    def __init__(self, arguments: dict[str, Any], vocab: Vocab) -> None:
        self._arguments = arguments
        self._vocab = vocab
        self._llm: Any = None
        # Imported when the engine starts, so the server runs where TensorRT-LLM is not installed.
        self._sampling_params: Any = None
        self._request_error: type[Exception] = RuntimeError
        self._closing = False
        self._active: set[Any] = set()  # RequestOutputs still streaming, aborted at shutdown

    @property
    def ready(self) -> bool:
        return self._llm is not None and not self._closing

    async def check_health(self) -> None:
        if self._closing:
            raise EngineError("The TensorRT-LLM engine is shutting down.", status=503, code="engine_shutting_down")

    def load(self) -> None:
        """Build the LLM now, in the calling thread; `start()` then has nothing left to do.

        The engine host process (`proxy/engines/host.py`) calls this in its main thread before its event loop
        runs, as trtllm-serve does: TensorRT-LLM's MPI start-up and signal handling assume the main thread.
        """
        self._llm = self._import_tensorrt_llm().LLM(**self._arguments)

    async def start(self) -> None:
        if self._llm is not None:
            return  # loaded by load()
        tensorrt_llm = self._import_tensorrt_llm()
        # In a server of one process the loop must answer /health meanwhile, so the LLM loads in a side thread.
        self._llm = await _build_in_thread(lambda: tensorrt_llm.LLM(**self._arguments))

    def _import_tensorrt_llm(self) -> Any:
        import tensorrt_llm
        from tensorrt_llm.executor import RequestError

        self._sampling_params, self._request_error = tensorrt_llm.SamplingParams, RequestError
        logger.info("loading %s with TensorRT-LLM %s", self._arguments.get("model"), tensorrt_llm.__version__)
        return tensorrt_llm

    async def close(self) -> None:
        self._closing = True
        for result in list(self._active):
            result.abort()
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
                    cached_tokens=output.cached_tokens,
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
        try:
            return self._llm.generate_async(
                request.prompt_token_ids, sampling_params=self._sampling(request.sampling), streaming=True
            )
        except (self._request_error, ValueError, TypeError) as exc:
            message = str(exc)
            if self._closing or "shutting down" in message:
                raise EngineError("The TensorRT-LLM engine is shutting down.", status=503) from exc
            code = "context_length_exceeded" if any(marker in message for marker in _TOO_LONG) else None
            raise EngineError(f"TensorRT-LLM rejected the request: {message}", status=400, code=code) from exc
        except RuntimeError as exc:  # "LLM is shutting down"
            raise EngineError(f"The TensorRT-LLM engine is not serving: {exc}", status=503) from exc

    def _sampling(self, sampling: SamplingParams) -> Any:
        return self._sampling_params(
            **sampling.request_fields(),  # max_tokens always set: TensorRT-LLM's default is 32
            detokenize=False,  # we parse token ids; text would be wasted work
            include_stop_str_in_output=True,  # keep <|call|>: without it a finished tool call cannot be told
        )

    def _restored_stop(self, completion: Any, reason: FinishReason) -> list[int]:
        """The Harmony stop token that ended a `stop` finish, when TensorRT-LLM left it out of token_ids."""
        stops = self._vocab.stop_token_ids
        if reason != "stop" or (completion.token_ids and completion.token_ids[-1] in stops):
            return []
        stop_reason = completion.stop_reason
        if isinstance(stop_reason, int) and stop_reason in stops:
            return [stop_reason]
        return [self._vocab.special.return_] if stop_reason is None else []  # None: the end token, <|return|>


def loaded_trtllm_engine(arguments: dict[str, Any]) -> TrtllmEngine:
    """A TrtllmEngine with its LLM built in the calling thread: the `build` an engine host process runs.

    Module-level and taking plain data, so it can be handed to a spawned process (functools.partial).
    """
    from parsers.vocab import load_vocab

    engine = TrtllmEngine(arguments, load_vocab())
    engine.load()
    return engine


async def _build_in_thread(build: Callable[[], Any]) -> Any:
    """Run `build` in a daemon thread so /health answers 503 while the model loads (minutes).

    Not asyncio.to_thread: executor threads are joined at exit, so a SIGTERM during the load would wait for it.
    The in-process path (one server process); requests are then submitted from the event loop thread. Where
    TensorRT-LLM's MPI start-up needs the main thread, run the engine host process instead (`load()`).
    An LLM that finishes loading after the server stopped waiting for it is shut down.
    """
    loop = asyncio.get_running_loop()
    built: asyncio.Future[Any] = loop.create_future()

    def settle(llm: Any, error: BaseException | None) -> None:
        if built.cancelled():
            if llm is not None:
                llm.shutdown()
        elif error is not None:
            built.set_exception(error)
        else:
            built.set_result(llm)

    def run() -> None:
        try:
            llm, error = build(), None
        except BaseException as exc:  # reported to the event loop, which fails the start-up
            llm, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, llm, error)
        except RuntimeError:  # the event loop is gone: the process is exiting
            if llm is not None:
                llm.shutdown()

    threading.Thread(target=run, name="trtllm-load", daemon=True).start()
    return await built
