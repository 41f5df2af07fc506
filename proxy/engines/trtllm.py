"""The in-process TensorRT-LLM engine: one `tensorrt_llm.LLM` (PyTorch backend) in the server process.

Written against the LLM API of TensorRT-LLM from the gpt-oss-dev container (1.0.0rc6) to 1.3
(tensorrt_llm/llmapi/llm.py, sampling_params.py, executor/result.py), adapting to each release as trtllm-serve
does (`trtllm_release.py`):
- `LLM(**arguments)` loads the model; with tensor/expert parallelism it starts TensorRT-LLM's own MPI workers.
- `generate_async(prompt_token_ids, sampling_params, streaming=True)` is a plain method called on the event
  loop thread; the `RequestOutput` it returns is async-iterated and yields the same object, mutated, each
  step. `outputs[0].token_ids_diff` holds the step's new tokens (several with `stream_interval` > 1).
- Stop tokens are stripped from `token_ids` unless `include_stop_str_in_output=True`, and the end token
  (`<|return|>`, the tokenizer's EOS) never appears in them: the engine puts the Harmony stop token back from
  `finish_reason`/`stop_reason`, because the parser must see `<|return|>` and `<|call|>`.
- `abort()` cancels a request (it then finishes `cancelled`); `shutdown()` stops the engine and its workers.
- An output constraint travels as `SamplingParams(guided_decoding=GuidedDecodingParams(...))`, enforced by the
  LLM's `guided_decoding_backend`; see `guided_decoding` for the form each backend and release takes.

Requests are sampled as trtllm-serve samples them (temperature and top_p 1.0, top_k 0 unless the client set
them). `RequestOutput.cached_tokens` exists from PR #7637 (merged 2025-10-16: absent on 1.0 and 1.1, read when
present); new-form structural tags from PR #7893.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from parsers.vocab import Vocab
from proxy.engines.base import EngineError, FinishReason, GenerationRequest, Step, Usage
from proxy.engines.trtllm_release import adapted_arguments, installed_release, release_key, sampling_defaults

logger = logging.getLogger("harmony_proxy.engine")

_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "cancelled",
    "timeout": "error",
    None: "stop",
}
_TOO_LONG = ("max_num_tokens", "max_seq_len", "should not exceed")
_CONSTRAINTS = "Output constraints (tool_choice required or named, strict tools, response_format, text.format)"


@dataclass(frozen=True)
class GuidedDecoding:
    """How this engine hands output constraints to TensorRT-LLM, decided once at start-up.

    `field` is the GuidedDecodingParams field a constrained request fills: `grammar` (llguidance: the Lark
    grammar of the whole completion) or `structural_tag` (xgrammar: the same language as a JSON structural
    tag); None when nothing is enforced, `reason` then saying why.
    """

    field: str | None
    how: str = ""  # the backend and form, when enforced
    reason: str = ""

    @property
    def message(self) -> str:
        if self.field:
            return f"{_CONSTRAINTS} are enforced by TensorRT-LLM's {self.how}; analysis stays free"
        return f"{_CONSTRAINTS} are NOT enforced, only described to the model in the prompt: {self.reason}"


def guided_decoding(
    backend: str | None, tensorrt_llm_version: str, xgrammar_version: str | None, speculative: bool = False
) -> GuidedDecoding:
    """The form each backend accepts (tensorrt_llm/_torch/pyexecutor/grammar_matcher.py).

    - llguidance takes `grammar` as Lark (`LLMatcher.grammar_from_lark`) in every release; it refuses
      structural tags. Its EOS is the tokenizer's, `<|return|>`, allowed where the grammar is complete.
    - xgrammar takes `structural_tag` as a JSON string. Since PR #7893 (September 2025, with xgrammar 0.1.25)
      the string goes to `compile_structural_tag` whole: the `{"type": "structural_tag", "format": ...}` form.
      Before it (1.0), only the legacy `{"structures": [...], "triggers": [...]}` form, free text around
      optional tags, which can require neither a call nor a JSON final answer: nothing is sent then.
    """
    if backend == "llguidance":
        return GuidedDecoding("grammar", "llguidance backend (a Lark grammar of the whole completion)")
    if backend == "xgrammar":
        if _has_format_structural_tags(tensorrt_llm_version, xgrammar_version):
            return GuidedDecoding("structural_tag", "xgrammar backend (a structural tag of the whole completion)")
        installed = f" with xgrammar {xgrammar_version}" if xgrammar_version else ""
        return GuidedDecoding(None, reason=(
            f"TensorRT-LLM {tensorrt_llm_version}{installed} takes xgrammar structural tags only in the legacy "
            "structures/triggers form, which can require neither a call nor a JSON answer; use "
            "--guided-decoding-backend llguidance (or guided_decoding_backend: llguidance) to enforce them"))
    if speculative:
        return GuidedDecoding(None, reason=(
            "no guided decoding backend: none is chosen by default with speculative_config (TensorRT-LLM 1.0 "
            "refuses the two together); set --guided-decoding-backend llguidance where your release allows it"))
    return GuidedDecoding(None, reason=(
        "no guided decoding backend (guided_decoding_backend unset, or --guided-decoding-backend none)"))


def _has_format_structural_tags(tensorrt_llm_version: str, xgrammar_version: str | None) -> bool:
    # PR #7893 upgraded the pinned xgrammar to 0.1.25 and passed structural tags through in one change, so the
    # installed xgrammar tells the form; where it cannot be read, the release: 1.2.0rc0 and later surely have it.
    if xgrammar_version is not None:
        return release_key(xgrammar_version) >= (0, 1, 25, 0)
    return release_key(tensorrt_llm_version) >= (1, 2, 0, 0)


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class TrtllmEngine:
    name = "trtllm"

    def __init__(self, arguments: dict[str, Any], vocab: Vocab) -> None:
        self._arguments = arguments
        self._vocab = vocab
        self._llm: Any = None
        # Imported when the engine starts, so the server runs where TensorRT-LLM is not installed.
        self._sampling_params: Any = None
        self._guided_params: Any = None
        self._guided = GuidedDecoding(None, reason="not started")
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
        tensorrt_llm, arguments = self._import_tensorrt_llm()
        self._llm = tensorrt_llm.LLM(**arguments)

    async def start(self) -> None:
        if self._llm is not None:
            return  # loaded by load()
        tensorrt_llm, arguments = self._import_tensorrt_llm()
        # In a server of one process the loop must answer /health meanwhile, so the LLM loads in a side thread.
        self._llm = await _build_in_thread(lambda: tensorrt_llm.LLM(**arguments))

    def _import_tensorrt_llm(self) -> tuple[Any, dict[str, Any]]:
        """TensorRT-LLM, and the LLM arguments adapted to its release (each adaptation said in the log)."""
        import tensorrt_llm
        from tensorrt_llm.executor import RequestError
        from tensorrt_llm.llmapi import GuidedDecodingParams, SamplingParams  # the stable path in every release

        self._sampling_params, self._request_error = SamplingParams, RequestError
        self._guided_params = GuidedDecodingParams
        release = installed_release(tensorrt_llm)
        logger.info("loading %s with TensorRT-LLM %s", self._arguments.get("model"), tensorrt_llm.__version__)
        arguments, notices = adapted_arguments(self._arguments, release)
        for notice in notices:
            logger.warning("%s", notice)
        self._guided = guided_decoding(
            arguments.get("guided_decoding_backend"), tensorrt_llm.__version__, _installed_version("xgrammar"),
            speculative=bool(arguments.get("speculative_config")),
        )
        (logger.info if self._guided.field else logger.warning)("%s", self._guided.message)
        return tensorrt_llm, arguments

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
        try:
            return self._llm.generate_async(request.prompt_token_ids, sampling_params=self._sampling(request),
                                            streaming=True)
        except (self._request_error, ValueError, TypeError) as exc:
            message = str(exc)
            if self._closing or "shutting down" in message:
                raise EngineError("The TensorRT-LLM engine is shutting down.", status=503) from exc
            code = "context_length_exceeded" if any(marker in message for marker in _TOO_LONG) else None
            raise EngineError(f"TensorRT-LLM rejected the request: {message}", status=400, code=code) from exc
        except RuntimeError as exc:  # "LLM is shutting down"
            raise EngineError(f"The TensorRT-LLM engine is not serving: {exc}", status=503) from exc

    def _sampling(self, request: GenerationRequest) -> Any:
        # max_tokens always set: TensorRT-LLM's default is 32. The sampling fields the client left out are sent as
        # trtllm-serve sends them: temperature alone would decode greedily before 1.2.
        fields = sampling_defaults(request.sampling.request_fields())
        if fields.get("ignore_eos"):
            # With end_id set, LLM._prepare_sampling_params skips SamplingParams._setup, which from 1.2 adds the
            # generation config's eos ids (<|call|>, <|endoftext|>) as stop tokens that ignore_eos does not lift.
            fields["end_id"] = self._vocab.special.return_  # the gpt-oss tokenizer's eos_token_id
        return self._sampling_params(
            **fields,
            detokenize=False,  # we parse token ids; text would be wasted work
            include_stop_str_in_output=True,  # keep <|call|>: without it a finished tool call cannot be told
            guided_decoding=self._guide(request),
        )

    def _guide(self, request: GenerationRequest) -> Any:
        """The request's GuidedDecodingParams, or None: unconstrained, or not enforceable here (then logged)."""
        grammar = request.constraint.grammar
        if grammar is None:
            return None
        if self._guided.field == "grammar":
            return self._guided_params(grammar=grammar.lark)
        if self._guided.field == "structural_tag":
            if grammar.structural_tag_gaps:  # xgrammar takes no Lark: use the llguidance backend to enforce it
                logger.warning("request %s: %s NOT enforced (xgrammar structural tags have no Lark form; the "
                               "llguidance backend enforces it)", request.request_id, grammar.structural_tag_gaps)
            return self._guided_params(structural_tag=json.dumps(grammar.structural_tag, separators=(",", ":")))
        logger.warning("request %s: %s, NOT enforced: %s", request.request_id, grammar.summary, self._guided.reason)
        return None

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
        except BaseException as exc:  # noqa: BLE001 - reported to the event loop, which fails the start-up
            llm, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, llm, error)
        except RuntimeError:  # the event loop is gone: the process is exiting
            if llm is not None:
                llm.shutdown()

    threading.Thread(target=run, name="trtllm-load", daemon=True).start()
    return await built
