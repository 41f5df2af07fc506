"""What the installed TensorRT-LLM release does that trtllm-serve's users rely on, and how the engine adapts.

The releases NVIDIA's gpt-oss guides name, read in TensorRT-LLM's source: the `release:gpt-oss-dev`
container (main of early August 2025, 1.0.0rc6), 1.0.x, 1.1.x, 1.2.x and 2026 main (1.3). What differs:
- sampling: on 1.0, TorchSampler argmaxes every request unless `enable_mixed_sampler: true` (removed in 1.1, PR
  #7294); before 1.2 (PR #8132) temperature alone decodes greedily, which is why trtllm-serve always sends
  `top_p=1.0` and `top_k=0` as well;
- `ignore_eos`: from 1.2 (PR #9514) `SamplingParams._setup` appends the generation config's eos ids
  (`<|endoftext|>`, `<|call|>`) to the stop tokens; `_setup` runs only when `end_id` is unset;
- per-request `seed` reaches TorchSampler only from PR #17172 (August 2026, 1.3);
- `RequestOutput.cached_tokens` from PR #7637 (merged 2025-10-16): 1.2 on, not 1.0 or 1.1;
- `speculative_config`: until 2026 a plain dict does not validate; trtllm-serve converts the YAML's with
  `DecodingBaseConfig.from_dict`;
- the TRITON MoE backend, the Hopper path of 1.0 to 1.2, is deprecated from PR #19035 (2026-09-15), where `AUTO`
  picks the MoE backend for the GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


def release_key(version: str) -> tuple[int, int, int, int]:
    """(major, minor, patch, rc) of a version string; a final release sorts after its release candidates."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?", version)
    if match is None:
        return 0, 0, 0, 0
    major, minor, patch, rc = match.groups()
    return int(major), int(minor), int(patch), int(rc) if rc is not None else 1 << 30


@dataclass(frozen=True)
class Release:
    version: str
    fields: frozenset[str]  # the LLM arguments it takes (TorchLlmArgs.model_fields)

    @property
    def mixed_sampler(self) -> bool:
        return "enable_mixed_sampler" in self.fields

    @property
    def temperature_alone_samples(self) -> bool:
        return release_key(self.version) >= (1, 2, 0, 0)

    @property
    def per_request_seed(self) -> bool:
        return release_key(self.version) >= (1, 3, 0, 0)

    @property
    def cached_tokens(self) -> bool:
        return release_key(self.version) >= (1, 2, 0, 0)

    @property
    def triton_moe_deprecated(self) -> bool:
        return release_key(self.version) >= (1, 3, 0, 0)


def installed_release(tensorrt_llm: Any) -> Release:
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    return Release(str(tensorrt_llm.__version__).split()[0], frozenset(TorchLlmArgs.model_fields.keys()))


def adapted_arguments(arguments: dict[str, Any], release: Release) -> tuple[dict[str, Any], list[str]]:
    """The LLM arguments this release needs to serve as trtllm-serve does, and what to say about them at start-up."""
    arguments = dict(arguments)
    notices = []
    if release.mixed_sampler:
        if "enable_mixed_sampler" not in arguments:
            arguments["enable_mixed_sampler"] = True
            notices.append(f"TensorRT-LLM {release.version} decodes every request greedily without "
                           "enable_mixed_sampler: set to true (NVIDIA's gpt-oss YAML for this release sets it)")
        elif not arguments["enable_mixed_sampler"]:
            notices.append("enable_mixed_sampler is false: TensorRT-LLM decodes EVERY request greedily, whatever "
                           "its temperature")
    speculative = arguments.get("speculative_config")
    if isinstance(speculative, dict):  # as trtllm-serve's update_llm_args_with_extra_dict
        from tensorrt_llm.llmapi.llm_args import DecodingBaseConfig

        arguments["speculative_config"] = DecodingBaseConfig.from_dict(speculative)
    moe = arguments.get("moe_config")
    if release.triton_moe_deprecated and isinstance(moe, dict) and str(moe.get("backend", "")).upper() == "TRITON":
        notices.append(f"moe_config backend TRITON is deprecated in TensorRT-LLM {release.version} (PR #19035): "
                       "on Hopper use backend AUTO, which picks the MoE kernels for the GPU")
    if not release.per_request_seed:
        notices.append(f"a request's seed is not applied by TensorRT-LLM {release.version} (per-request seeds "
                       "reach its sampler from PR #17172, August 2026), nor by its trtllm-serve")
    if not release.cached_tokens:
        notices.append(f"TensorRT-LLM {release.version} does not report cached prompt tokens (PR #7637, 1.2): "
                       "usage leaves cached_tokens out rather than say 0")
    return arguments, notices


def sampling_defaults(fields: dict[str, Any]) -> dict[str, Any]:
    """trtllm-serve's request defaults: temperature and top_p 1.0, top_k 0 (all tokens), each unless the client set
    it. Together they select sampling on every release; temperature alone is greedy before 1.2."""
    return {"temperature": 1.0, "top_p": 1.0, "top_k": 0, **fields}
