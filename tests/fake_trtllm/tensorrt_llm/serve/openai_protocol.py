"""tensorrt_llm/serve/openai_protocol.py: `CompletionRequest` and its `to_sampling_params`, as trtllm-serve converts a
request (late 2025, id 3927323397 off. ~12400; the same defaults in 2026): temperature and top_p 1.0 unless set,
top_k 0, stop tokens, ignore_eos, min_tokens, detokenize, include_stop_str_in_output. `OpenAIBaseModel` forbids
extra fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tensorrt_llm.executor.params.sampling import SamplingParams


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompletionRequest(OpenAIBaseModel):
    model: str
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    detokenize: bool = True

    def to_sampling_params(self, vocab_size: int = 32000, gather_generation_logits: bool = False,
                           backend: str | None = None) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, n=self.n, seed=self.seed,
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_p=self.top_p if self.top_p is not None else 1.0, top_k=self.top_k,
            stop_token_ids=self.stop_token_ids, include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos, min_tokens=self.min_tokens, detokenize=self.detokenize)
