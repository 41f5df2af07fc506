"""tensorrt_llm/sampling_params.py (executor/params/sampling.py in 2026): keyword-only, slotted dataclasses;
max_tokens defaults to 32.

`_setup` runs in `LLM._prepare_sampling_params` only when `end_id` is None: it takes the tokenizer's eos as
`end_id` and, from PR #9514 (1.2), appends the generation config's eos ids other than `end_id` to
`stop_token_ids`, whatever `ignore_eos` says. `decoding()` tells which sampler the TorchSampler of each release
runs for the request (see `_surface.py`).

`GuidedDecodingParams` is the same in every release since 0.18: five guides, of which a request may set one;
that is checked by `SamplingParams.__post_init__` (through `_validate`), not by GuidedDecodingParams itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tensorrt_llm._surface import SURFACE


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None  # EBNF for xgrammar, Lark for llguidance
    json_object: bool = False
    structural_tag: str | None = None  # a JSON string; xgrammar only

    def _validate(self) -> None:
        num_guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    n: int = 1
    best_of: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    if SURFACE.release >= 2:  # fields added after 1.1
        prompt_ignore_length: int | None = None
        logprobs_mode: str = "raw"
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _setup(self, eos_token_id: int, generation_config_eos: list[int] | None) -> SamplingParams:
        if self.end_id is None:
            self.end_id = eos_token_id
            self.pad_id = self.pad_id if self.pad_id is not None else eos_token_id
        if generation_config_eos and SURFACE.generation_config_stops:
            stops = list(self.stop_token_ids or [])
            stops += [t for t in generation_config_eos if t != self.end_id and t not in stops]
            self.stop_token_ids = stops or None
        return self

    def decoding(self, mixed_sampler: bool) -> str:
        """"greedy" or "sampling": what TorchSampler does with this request on the surface's release."""
        if self.top_k == 1 or self.top_p == 0 or self.temperature == 0:
            return "greedy"
        if SURFACE.mixed_sampler and not mixed_sampler:
            return "greedy"  # 1.0: one argmax for the whole batch unless enable_mixed_sampler
        if SURFACE.temperature_alone_samples:
            unset = self.temperature is None and self.top_p is None and self.top_k is None
        else:  # before PR #8132 only top-k / top-p select sampling; temperature alone is ignored
            unset = self.top_p is None and self.top_k is None
        return "greedy" if unset else "sampling"

    def _validate(self) -> None:
        if SURFACE.checks_sampling_ranges:
            if self.top_p is not None and not 0 <= self.top_p <= 1:
                raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
            if self.top_k is not None and self.top_k < 0:
                raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
            if self.temperature is not None and self.temperature < 0:
                raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
