"""Which TensorRT-LLM release the fake mirrors (fake only): set FAKE_TRTLLM_SURFACE before importing it.

One surface per release line NVIDIA's gpt-oss guides name (sources: /work/brief/trtllm-releases-2026.md; the
TensorRT-LLM file versions are cited where each rule is written):
- `gpt-oss-dev` (alias `oldest`) and `1.0`: the `release:gpt-oss-dev` container (main of early August 2025) and
  1.0.x. TorchSampler argmaxes every request unless `enable_mixed_sampler: true`; structural tags only in the
  legacy form; no guided decoding with speculative decoding; no `cached_tokens`.
- `1.1`: `enable_mixed_sampler` removed (PR #7294), `sampler_type` (PR #6831); temperature alone still greedy.
- `1.2`: temperature alone samples (PR #8132); `cached_tokens` (PR #7637); generation-config eos ids become stop
  tokens (PR #9514).
- `1.3`: 1.3.0rc19 and later 1.3.0rcs (mid 2026): explicit command-line flags beat the YAML and `kv_cache_config`
  is deep-merged (PR #14812); PyTorch gets no scheduler_config; `speculative_config` is a discriminated union
  (no `DecodingBaseConfig.from_dict`); MoE `AUTO`; `--served_model_name`, `--kv_cache_dtype`, `--telemetry`.
- `1.4` (alias `newest`, the default): 2026 main / 1.4.0rc. `sampler_type` removed (PR #18232), `WIDEEP` MoE
  removed; per-request seeds (PR #17172); `ignore_eos` drops every stop word; `--num_serve_frontends` (PR #16523,
  merged 2026-07-17); gRPC launchers imported inside `serve()` (`tensorrt_llm.grpc.openengine.server`);
  `--middleware`; no `--fail_fast_on_attention_window_too_large` (id 59682888564 deprecates it, TRT backend only).
- OPEN PRs, not merged when read (2026-09), on top of `1.4`, so that the adapter already survives them:
  `1.4+pr19379` (`--num_serve_frontends` defaults to 8; the LlmArgs field stays 1: PR description 2026-09-18),
  `1.4+pr17787` (OpenAIServer builds the LLM from a `generator_factory`), `1.4+pr16939` (the server is made before
  the LLM and serves 503 while `serve_with_lifecycle` builds it). The last two follow issue 33's reading of the PR
  descriptions; their diffs were not in the index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class Surface:
    name: str
    version: str
    release: int  # 0: gpt-oss-dev and 1.0, 1: 1.1, 2: 1.2, 3: 1.3.0rc19+, 4: 1.4 (2026 main)
    open_pr: int | None = None  # an unmerged PR this surface adds (see above)

    cached_tokens = property(lambda self: self.release >= 2)  # PR #7637 (1.2.0rc1)
    structural_tag_form = property(lambda self: "format" if self.release >= 2 else "legacy")  # PR #7893
    guided_with_speculation = property(lambda self: self.release >= 1)
    checks_sampling_ranges = property(lambda self: self.release >= 1)
    mixed_sampler = property(lambda self: self.release == 0)  # enable_mixed_sampler gate (removed, PR #7294)
    temperature_alone_samples = property(lambda self: self.release >= 2)  # PR #8132
    generation_config_stops = property(lambda self: self.release >= 2)  # PR #9514
    per_request_seed = property(lambda self: self.release >= 4)  # PR #17172, August 2026
    ignore_eos_drops_stop_words = property(lambda self: self.release >= 4)  # base_worker id 55301320707
    sampling_params_moved = property(lambda self: self.release >= 3)
    cli_wins = property(lambda self: self.release >= 3)  # PR #14812 (2026-06-01): explicit flags beat the YAML
    # 2026 llm.py (id 55216765702) `_prepare_sampling_params`: add_thinking_budget_logits_processor(reasoning_parser)
    thinking_budget = property(lambda self: self.release >= 3)


SURFACES = {
    "gpt-oss-dev": Surface("gpt-oss-dev", "1.0.0rc6", 0),
    "1.0": Surface("1.0", "1.0.0", 0),
    "1.1": Surface("1.1", "1.1.0", 1),
    "1.2": Surface("1.2", "1.2.0", 2),
    "1.3": Surface("1.3", "1.3.0rc19", 3),
    "1.4": Surface("1.4", "1.4.0rc1", 4),
    "1.4+pr19379": Surface("1.4+pr19379", "1.4.0rc1+pr19379", 4, 19379),
    "1.4+pr17787": Surface("1.4+pr17787", "1.4.0rc1+pr17787", 4, 17787),
    "1.4+pr16939": Surface("1.4+pr16939", "1.4.0rc1+pr16939", 4, 16939),
}
ALIASES = {"oldest": "gpt-oss-dev", "newest": "1.4"}
_chosen = os.environ.get("FAKE_TRTLLM_SURFACE", "newest")
SURFACE = SURFACES[ALIASES.get(_chosen, _chosen)]


def plain(value: Any) -> Any:
    """An LLM argument as JSON (pydantic models dumped, enums by value): how the fake records what it was given."""
    if hasattr(value, "model_dump"):
        return plain(value.model_dump())
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value
