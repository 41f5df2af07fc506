"""Which TensorRT-LLM release the fake mirrors (fake only): set FAKE_TRTLLM_SURFACE before importing it.

One surface per release NVIDIA's gpt-oss guides name (agents-2026.md section 4 has the PRs):
- `gpt-oss-dev` (alias `oldest`): the `release:gpt-oss-dev` container, main of early August 2025 (1.0.0rc6).
- `1.0`: 1.0.x, cut about 2025-08-06. Like gpt-oss-dev: TorchSampler argmaxes every request unless
  `enable_mixed_sampler: true`; structural tags only in the legacy structures/triggers form; no guided decoding
  with speculative decoding; no `cached_tokens`.
- `1.1`: 1.1.x, cut about 2025-09-29. `enable_mixed_sampler` removed (PR #7294); temperature alone still decodes
  greedily (before PR #8132); still no `cached_tokens` (PR #7637 merged 2025-10-16).
- `1.2`: 1.2.x, cut about 2026-01-15. Temperature alone samples (PR #8132); `cached_tokens`; `_setup` adds the
  generation config's eos ids to the stop tokens (PR #9514), so `ignore_eos` still stops at `<|call|>`.
- `1.3` (alias `newest`, the default): main of September 2026. Per-request seeds in TorchSampler (PR #17172);
  `speculative_config` may be a plain dict (a discriminated union); MoE backend `AUTO`, `TRITON` deprecated
  (PR #19035); `tensorrt_llm.sampling_params` warns (moved to `executor/params/sampling.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Surface:
    name: str
    version: str
    release: int  # 0: gpt-oss-dev and 1.0, 1: 1.1, 2: 1.2, 3: 1.3 (main)
    cached_tokens: bool  # RequestOutput.cached_tokens (PR #7637, 2025-10-16)
    structural_tag_form: str  # "legacy" (structures/triggers) or "format" (xgrammar >= 0.1.25)
    guided_with_speculation: bool  # guided decoding allowed together with speculative decoding
    checks_sampling_ranges: bool  # SamplingParams._validate checks top_p, top_k, temperature

    @property
    def mixed_sampler(self) -> bool:
        """`enable_mixed_sampler` exists, and without it every request is decoded greedily (removed, PR #7294)."""
        return self.release == 0

    @property
    def temperature_alone_samples(self) -> bool:  # PR #8132, 2025-10-08
        return self.release >= 2

    @property
    def generation_config_stops(self) -> bool:  # PR #9514, 2025-12
        return self.release >= 2

    @property
    def per_request_seed(self) -> bool:  # PR #17172, August 2026
        return self.release >= 3

    @property
    def speculative_dict(self) -> bool:  # a dict validates only where decoding_type is a field, 2026
        return self.release >= 3

    @property
    def sampling_params_moved(self) -> bool:  # tensorrt_llm.sampling_params warns, 2026
        return self.release >= 3


SURFACES = {
    "gpt-oss-dev": Surface("gpt-oss-dev", "1.0.0rc6", 0, cached_tokens=False, structural_tag_form="legacy",
                           guided_with_speculation=False, checks_sampling_ranges=False),
    "1.0": Surface("1.0", "1.0.0", 0, cached_tokens=False, structural_tag_form="legacy",
                   guided_with_speculation=False, checks_sampling_ranges=False),
    "1.1": Surface("1.1", "1.1.0", 1, cached_tokens=False, structural_tag_form="legacy",
                   guided_with_speculation=True, checks_sampling_ranges=True),
    "1.2": Surface("1.2", "1.2.0", 2, cached_tokens=True, structural_tag_form="format",
                   guided_with_speculation=True, checks_sampling_ranges=True),
    "1.3": Surface("1.3", "1.3.0rc1", 3, cached_tokens=True, structural_tag_form="format",
                   guided_with_speculation=True, checks_sampling_ranges=True),
}
ALIASES = {"oldest": "gpt-oss-dev", "newest": "1.3"}
_chosen = os.environ.get("FAKE_TRTLLM_SURFACE", "newest")
SURFACE = SURFACES[ALIASES.get(_chosen, _chosen)]
