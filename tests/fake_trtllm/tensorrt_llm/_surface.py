"""Which TensorRT-LLM release the fake mirrors (fake only): set FAKE_TRTLLM_SURFACE before importing it.

- `oldest`: the 1.0 era users still run from NVIDIA's first gpt-oss guides (the `release:gpt-oss-dev` and
  `release:1.0.0rc6` containers, August 2025). Read from NVIDIA/TensorRT-LLM at 1.0.0rc4 (sampling_params.py),
  executor/result.py before PR #7637 (no `cached_tokens`), _torch/pyexecutor/grammar_matcher.py before PR #7893
  (structural tags parsed as the legacy `{"structures": [...], "triggers": [...]}`) and py_executor_creator.py
  of mid-2025 (guided decoding refused with speculative decoding).
- `newest` (the default): 1.2 to 1.3 (sampling_params.py and grammar_matcher.py of main, 2026): `cached_tokens`
  on every result, structural tags handed to xgrammar >= 0.1.25 as JSON (`{"type": "structural_tag",
  "format": ...}`), `top_p`/`top_k`/`temperature` checked when SamplingParams is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Surface:
    name: str
    version: str
    cached_tokens: bool  # RequestOutput.cached_tokens (PR #7637, September 2025)
    structural_tag_form: str  # "legacy" (structures/triggers) or "format" (xgrammar >= 0.1.25)
    guided_with_speculation: bool  # guided decoding allowed together with speculative decoding
    checks_sampling_ranges: bool  # SamplingParams._validate checks top_p, top_k, temperature


SURFACES = {
    "oldest": Surface("oldest", "1.0.0rc6", cached_tokens=False, structural_tag_form="legacy",
                      guided_with_speculation=False, checks_sampling_ranges=False),
    "newest": Surface("newest", "1.3.0rc1", cached_tokens=True, structural_tag_form="format",
                      guided_with_speculation=True, checks_sampling_ranges=True),
}
SURFACE = SURFACES[os.environ.get("FAKE_TRTLLM_SURFACE", "newest")]
