"""tensorrt_llm/llmapi/llm.py and executor/result.py, faked with their real behaviours:

- `LLM(model, tokenizer=None, ..., tensor_parallel_size=1, ..., **kwargs)`: an unknown kwarg raises
  `ValueError("LLM got invalid argument: <key>")`; nested configs reject unknown keys.
- `generate_async(inputs, sampling_params=None, ..., streaming=False)` is a plain method that must be called with
  an event loop running; it raises `RuntimeError("LLM is shutting down")` after `shutdown()`, and `RequestError`
  for a prompt longer than `max_num_tokens` without `enable_chunked_prefill` (longer than `max_seq_len` with it).
- The `RequestOutput` is async-iterated and yields the same object each step, mutated; `outputs[0]` has
  cumulative `token_ids`, `token_ids_diff`, `finish_reason`, `stop_reason`. `cached_tokens` is on the output
  only on the newest surface (PR #7637); on the oldest, reading it raises AttributeError as the real class.
- `guided_decoding_backend` (None, "xgrammar" or "llguidance", a pydantic Literal) builds a guided decoder;
  without one, a request's `guided_decoding` is silently ignored, as in the real engine. With one, each guided
  request's guide is checked by `_torch/pyexecutor/grammar_matcher.py` when it is scheduled, and a guide the
  backend refuses fails that request; with llguidance, the first scripted token the grammar rejects is
  recorded (`guide_rejected`). The oldest surface refuses guided decoding with speculative decoding.
- One step carries `stream_interval` tokens. The end token (`end_id`, the tokenizer's EOS `<|return|>`) ends with
  `stop` and is left out of `token_ids`; a stop token id ends with `stop`, `stop_reason` set to it, and is
  stripped unless `include_stop_str_in_output`. `ignore_eos` disables the end token only.
- `generate_async` runs `SamplingParams._setup` when `end_id` is None (from 1.2 it appends the generation config's
  eos ids, `<|endoftext|>` and `<|call|>`, to the stop tokens) and records which sampler the release's TorchSampler
  runs for the request (`decoding`: greedy or sampling; 1.0 argmaxes everything without `enable_mixed_sampler`) and
  whether the request's seed reaches it (`seed_used`, from PR #17172).
- Arguments are validated by the release's strict `TorchLlmArgs` (llm_args.py); `LLM.args` holds the result.
  `max_seq_len` stays None when unset, as the PyTorch backend leaves it (`_TorchLLM._build_model` never writes
  back what its executor deduces, id 55216765702); the executor limits prompts to the model's
  `max_position_embeddings`, on `LLM._hf_model_config` (from the folder's `config.json`, else gpt-oss's 131072).
- From 2026 (id 55216765702), `_prepare_sampling_params` adds the thinking-budget logits processor for the
  arguments' `reasoning_parser` to every request (recorded as `thinking_budget`).
- KV-cache events (`get_kv_cache_events_async`) when `kv_cache_config.event_buffer_max_size` > 0 and
  `enable_block_reuse`. Each attention data-parallel rank (`enable_attention_dp`: `tensor_parallel_size` ranks,
  requests dealt in turn) has its own cache and `event_id` sequence from 0, its events interleaved with the
  others'. First `created` for each attention window (gpt-oss: sliding 128 and full 131072 tokens); then, per
  prompt, `stored` for the new 32-token blocks in each window, a trailing partial block included (partial reuse,
  the default), and `removed` past `cache_blocks` (a file in the model folder) blocks, least recently used first.
- `abort()` ends the request with `cancelled`. Prompt prefixes are cached in 32-token blocks.
- A per-request executor error is raised as `RequestError` from the iteration (a `fail_after` file in the
  model folder makes each request fail after that many tokens).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Self

from tensorrt_llm._surface import SURFACE, plain
from tensorrt_llm._torch.pyexecutor.grammar_matcher import FACTORIES
from tensorrt_llm.executor import RequestError
from tensorrt_llm.executor.params.sampling import SamplingParams
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

TOKENS_PER_BLOCK = 32
WINDOWS = (128, 131072)  # gpt-oss: sliding-window and full-attention layers, each with its own block pool


def _tokens(ids: list[int]) -> list[dict[str, Any]]:
    return [{"type": "unique_token", "token_id": t} for t in ids]
GENERATION_CONFIG_EOS = [200002, 199999, 200012]  # gpt-oss generation_config.json eos_token_id


class CompletionOutput:
    __slots__ = ("_last_token_ids_len", "finish_reason", "index", "stop_reason", "text", "token_ids")

    def __init__(self, index: int) -> None:
        self.index, self.text, self.token_ids = index, "", []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._last_token_ids_len = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


class RequestOutput:
    def __init__(self, llm: LLM, request_id: int, prompt: list[int], params: SamplingParams, script: list[int]) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # the real class then fails on await: "The asyncio event loop was not present..."
        self._llm, self.request_id, self.prompt_token_ids = llm, request_id, prompt
        self.sampling_params = params
        self.outputs = [CompletionOutput(0)]
        cached = llm._cache_hit(prompt, request_id)
        if SURFACE.cached_tokens:
            self.cached_tokens = cached
        self._done = False
        self._aborted = False
        self._queue: asyncio.Queue[tuple[list[int], str | None, Any]] = asyncio.Queue()
        self._producer = self._loop.create_task(self._produce(script)) if self._loop else None

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        if not self._aborted and not self._done:
            self._aborted = True
            self._llm._record("abort", request_id=self.request_id)
            if self._producer is not None:
                self._producer.cancel()
            self._queue.put_nowait(([], "cancelled", None))

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        if self._loop is None:
            raise AssertionError("The asyncio event loop was not present during initialization")
        tokens, finish, stop_reason = await self._queue.get()
        if finish == "error":
            self._done = True
            raise RequestError(stop_reason)
        output = self.outputs[0]
        output._last_token_ids_len = len(output.token_ids)
        output.token_ids.extend(tokens)
        if finish is not None:
            output.finish_reason, output.stop_reason, self._done = finish, stop_reason, True
        return self

    async def _produce(self, script: list[int]) -> None:
        params, llm = self.sampling_params, self._llm
        matcher = None
        if params.guided_decoding is not None and llm.guided_decoder is not None:
            try:
                matcher = llm.guided_decoder.create(params.guided_decoding)
            except (ValueError, KeyError, TypeError) as exc:
                self._queue.put_nowait(([], "error", f"Guided decoding failed: {type(exc).__name__}: {exc}"))
                return
        # 2026 base_worker (id 55301320707 off. 26355): ignore_eos drops every stop word
        drop = params.ignore_eos and SURFACE.ignore_eos_drops_stop_words
        stops = set() if drop else set(params.stop_token_ids or ())
        end_id = None if params.ignore_eos else params.end_id
        step: list[int] = []
        for done, token in enumerate(script):  # `done` tokens generated before this one
            if done >= params.max_tokens:
                break
            if done == llm.fail_after:
                self._queue.put_nowait((step, None, None))
                self._queue.put_nowait(([], "error", "Encountered an error in forward function: CUDA out of memory"))
                return
            if matcher is not None and not matcher.accept_token(token):
                llm._record("guide_rejected", request_id=self.request_id, index=done, token=token)
                matcher = None  # a masked model would have written another token here
            may_stop = done + 1 >= (params.min_tokens or 0)
            if may_stop and token == end_id:
                self._queue.put_nowait((step, "stop", None))  # the end token is not returned
                return
            if may_stop and token in stops:
                kept = [token] if params.include_stop_str_in_output else []
                self._queue.put_nowait((step + kept, "stop", token))
                return
            step.append(token)
            if len(step) == llm.stream_interval:
                await asyncio.sleep(llm.step_seconds)
                self._queue.put_nowait((step, None, None))
                step = []
        self._queue.put_nowait((step, "length", None))


class LLM:
    def __init__(self, model: str | Path, **kwargs: Any) -> None:
        for key in kwargs:  # llm.py (id 55216765702 off. ~9000): model_fields | {"_mpi_session", "backend"}
            if key not in TorchLlmArgs.model_fields and key not in ("backend", "_mpi_session"):
                raise ValueError(f"LLM got invalid argument: {key}")
        self.args = TorchLlmArgs(model=str(model), **{k: v for k, v in kwargs.items()
                                                      if k not in ("backend", "_mpi_session")})
        config = Path(model) / "config.json"
        positions = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else 131072
        self._hf_model_config = type("PretrainedConfig", (), {"max_position_embeddings": positions})()
        backend = self.args.guided_decoding_backend
        if backend and self.args.speculative_config is not None and not SURFACE.guided_with_speculation:
            raise ValueError("Guided decoding is not supported with speculative decoding.")
        self.mixed_sampler = bool(getattr(self.args, "enable_mixed_sampler", False))
        self._folder = Path(model)
        script = self._folder / "script.jsonl"
        if not script.is_file():
            raise ValueError(f"cannot load model {model}: no weights (script.jsonl) found")
        from fake_tokenizer import harmony_vocab

        vocab = harmony_vocab()
        self._scripts = [vocab.encode_harmony(json.loads(line)["completion"])
                         for line in script.read_text().splitlines() if line.strip()]
        self.end_id = vocab.special.return_  # the gpt-oss tokenizer's eos_token_id
        self.guided_decoder = FACTORIES[backend](vocab) if backend else None
        self.stream_interval = self.args.stream_interval
        self.max_num_tokens = int(self.args.max_num_tokens or 8192)
        self.max_seq_len = int(self.args.max_seq_len or positions)
        self.chunked_prefill = self.args.enable_chunked_prefill
        self.step_seconds = float(_read(self._folder / "step_seconds", "0"))
        self.fail_after = int(_read(self._folder / "fail_after", "-1"))
        time.sleep(float(_read(self._folder / "load_seconds", "0")))  # loading weights takes a while
        kv = self.args.kv_cache_config
        self._block_reuse = kv.enable_block_reuse
        self._events_on = kv.event_buffer_max_size > 0 and kv.enable_block_reuse
        self._ranks = self.args.tensor_parallel_size if self.args.enable_attention_dp else 1
        # per rank: block hashes held (least recently used first), prompts seen, event ids
        self._blocks: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self._ranks)]
        self._capacity = int(_read(self._folder / "cache_blocks", "1000000"))
        self._events: list[dict[str, Any]] = []
        self._event_ids = [itertools.count() for _ in range(self._ranks)]  # per rank, for the LLM's life
        self._seen_prompts: list[list[list[int]]] = [[] for _ in range(self._ranks)]
        if self._events_on:
            for rank in range(self._ranks):
                for window in WINDOWS:
                    self._event(rank, window, {"type": "created", "num_blocks_per_cache_level": [self._capacity]})
        self._next_script = 0
        self._next_id = 0
        self._shut_down = False
        # TensorRT-LLM's MPI start-up and signal handling assume the main thread: record where the LLM was built.
        self._record("init", args=plain({"model": str(model), **kwargs}), instance=id(self),
                     main_thread=threading.current_thread() is threading.main_thread(), pid=os.getpid(),
                     surface=SURFACE.name)

    def generate_async(self, inputs: Any, sampling_params: SamplingParams | None = None, lora_request: Any = None,
                       prompt_adapter_request: Any = None, streaming: bool = False,
                       kv_cache_retention_config: Any = None, disaggregated_params: Any = None,
                       _postproc_params: Any = None, scheduling_params: Any = None,
                       cache_salt: str | None = None) -> RequestOutput:
        if self._shut_down:
            raise RuntimeError("LLM is shutting down")
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"The sampling_params must be type SamplingParams or None, but got {type(params)}")
        if not (isinstance(inputs, list) and all(isinstance(t, int) for t in inputs)):
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        if len(inputs) > self.max_seq_len:  # _check_arguments: with or without chunked prefill
            raise ValueError(f"The sum of prompt length ({len(inputs)}) and query length (0) should not exceed "
                             f"max_seq_len ({self.max_seq_len})")
        if not self.chunked_prefill and len(inputs) > self.max_num_tokens:
            raise RequestError(f"The sum of prompt length ({float(len(inputs))}), query length (0) should not "
                               f"exceed max_num_tokens ({self.max_num_tokens})")
        if params.end_id is None:
            params._setup(self.end_id, GENERATION_CONFIG_EOS)
        self._next_id += 1
        script = self._scripts[self._next_script % len(self._scripts)]
        self._next_script += 1
        sampling = {name: getattr(params, name) for name in params.__slots__ if name != "guided_decoding"}
        guided = params.guided_decoding
        thinking_budget = SURFACE.thinking_budget and self.args.reasoning_parser is not None
        self._record("generate", request_id=self._next_id, prompt_length=len(inputs), streaming=streaming,
                     thinking_budget=thinking_budget, rank=(self._next_id - 1) % self._ranks,
                     sampling=sampling, decoding=params.decoding(self.mixed_sampler), instance=id(self),
                     seed_used=params.seed if SURFACE.per_request_seed else None,
                     guided=guided and {name: getattr(guided, name) for name in guided.__slots__
                                        if getattr(guided, name) not in (None, False)})
        return RequestOutput(self, self._next_id, list(inputs), params, script)

    def shutdown(self) -> None:
        if not self._shut_down:
            self._shut_down = True
            self._record("shutdown")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.shutdown()
        return False

    def _cache_hit(self, prompt: list[int], request_id: int) -> int:
        rank = (request_id - 1) % self._ranks  # attention DP deals requests to the ranks in turn
        best = 0
        if self._block_reuse:
            for seen in self._seen_prompts[rank]:
                common = next((i for i, (a, b) in enumerate(zip(seen, prompt)) if a != b), min(len(seen), len(prompt)))
                best = max(best, common // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK)
        self._seen_prompts[rank].append(prompt)
        if self._events_on:
            self._store_blocks(prompt, rank)
        return best

    def _store_blocks(self, prompt: list[int], rank: int) -> None:
        blocks = self._blocks[rank]
        for window in WINDOWS:  # the same blocks in each window's pool, hashed per window
            parent, new_parent, new = None, None, []
            for start in range(0, len(prompt), TOKENS_PER_BLOCK):
                chunk = prompt[start:start + TOKENS_PER_BLOCK]
                key = hash((window, parent, tuple(chunk)))
                held = (window, key) in blocks and len(chunk) == TOKENS_PER_BLOCK
                if not held:  # chained hashes: the new blocks are the prompt's tail
                    new_parent = parent if not new else new_parent
                    new.append({"type": "stored_block", "block_hash": key, "tokens": _tokens(chunk)})
                if len(chunk) < TOKENS_PER_BLOCK:
                    break  # the trailing partial block: stored (partial reuse), not kept for reuse here
                blocks[(window, key)] = None
                blocks.move_to_end((window, key))
                parent = key
            if new:
                self._event(rank, window, {"type": "stored", "parent_hash": new_parent, "blocks": new})
        while len(blocks) > self._capacity * len(WINDOWS):
            window, key = blocks.popitem(last=False)[0]
            self._event(rank, window, {"type": "removed", "block_hashes": [key]})

    def _event(self, rank: int, window: int, data: dict[str, Any]) -> None:
        self._events.append({"event_id": next(self._event_ids[rank]), "window_size": window,
                             "attention_dp_rank": rank, "data": data})

    async def get_kv_cache_events_async(self, timeout: float | None = 2) -> Any:
        """The events recorded since the last call (llm.py: an async iterable); waits up to `timeout` for one."""
        waited = 0.0
        while not self._events and timeout and waited < timeout:
            await asyncio.sleep(0.01)
            waited += 0.01
        events, self._events = self._events, []
        for event in events:
            yield event

    def _record(self, event: str, **details: Any) -> None:
        with (self._folder / "events.jsonl").open("a") as log:
            log.write(json.dumps({"event": event, **details}, default=str) + "\n")


def _read(path: Path, default: str) -> str:
    return path.read_text().strip() if path.is_file() else default
