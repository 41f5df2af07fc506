"""tensorrt_llm/sampling_params.py: keyword-only, slotted; max_tokens defaults to 32."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    n: int = 1
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    guided_decoding: Any = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
