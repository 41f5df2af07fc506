"""tensorrt_llm/llmapi/llm_args.py, reduced to what argument checking needs: the field names of each release, the
strict (extra="forbid") nested configs, the MoE backends, and `DecodingBaseConfig.from_dict`, which trtllm-serve
(`update_llm_args_with_extra_dict`) applies to a YAML's `speculative_config`. Pydantic raises ValidationError, a
ValueError, for an unknown nested key.

Until 2026 `decoding_type` is a ClassVar of each speculative config class, so a plain dict is not a valid
`speculative_config` (the union cannot tell the classes apart); from 2026 it is a discriminated union and a dict
validates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from tensorrt_llm._surface import SURFACE


class _Fields:
    def __init__(self, names: set[str]) -> None:
        self._names = names

    def keys(self) -> set[str]:
        return self._names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(self._names)


_EVERY_RELEASE = {
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code", "tensor_parallel_size",
    "dtype", "revision", "tokenizer_revision", "pipeline_parallel_size", "context_parallel_size",
    "moe_expert_parallel_size", "moe_tensor_parallel_size", "moe_cluster_parallel_size", "gpus_per_node",
    "enable_attention_dp", "cp_config", "max_batch_size", "max_num_tokens", "max_seq_len", "max_input_len",
    "max_beam_width", "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend",
    "num_postprocess_workers", "postprocess_tokenizer_dir", "reasoning_parser", "scheduler_config",
    "cache_transceiver_config", "speculative_config", "backend", "cuda_graph_config", "attention_dp_config",
    "disable_overlap_scheduler", "moe_config", "attn_backend", "print_iter_log", "enable_iter_perf_stats",
    "stream_interval", "torch_compile_config", "enable_autotuner", "load_format",
}
_BY_RELEASE = {  # fields a release adds (+) or removes (-), oldest first
    0: {"enable_mixed_sampler", "use_torch_sampler"},  # enable_mixed_sampler: removed by PR #7294 (1.1)
    1: {"sampler_type", "fail_fast_on_attention_window_too_large", "batch_wait_timeout_ms"},
    2: {"otlp_traces_endpoint", "checkpoint_format"},
    3: {"custom_tokenizer"},
}
_REMOVED = {1: {"enable_mixed_sampler", "use_torch_sampler"}}


def _fields_of(release: int) -> set[str]:
    names = set(_EVERY_RELEASE)
    for step in range(release + 1):
        names |= _BY_RELEASE[step]
        names -= _REMOVED.get(step, set())
    return names


class TorchLlmArgs:
    model_fields = _Fields(_fields_of(SURFACE.release))


NESTED: dict[str, set[str]] = {
    "kv_cache_config": {"enable_block_reuse", "max_tokens", "free_gpu_memory_fraction", "host_cache_size",
                        "enable_partial_reuse", "copy_on_partial_reuse", "dtype", "tokens_per_block"},
    "cuda_graph_config": {"batch_sizes", "max_batch_size", "enable_padding"},
    "moe_config": {"backend", "max_num_tokens", "load_balancer"} | ({"disable_finalize_fusion"}
                                                                   if SURFACE.release >= 2 else set()),
    "attention_dp_config": {"enable_balance", "timeout_iters", "batching_wait_iters"},
    "scheduler_config": {"capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config"},
}
# 1.0 to 1.2: TRITON is the fast MoE path on Hopper (TRTLLM does not run there). 1.3: AUTO picks per GPU, and
# TRITON is deprecated (PR #19035, 2026-09-15).
MOE_BACKENDS = {"CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"} | (
    {"AUTO"} if SURFACE.release >= 3 else set())
CAPACITY_SCHEDULER_POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")
DYNAMIC_BATCH_KEYS = {"enable_batch_size_tuning", "enable_max_num_tokens_tuning", "dynamic_batch_moving_average_window"}


class CapacitySchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


@dataclass
class DynamicBatchConfig:
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


@dataclass
class SchedulerConfig:
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: Any = None
    dynamic_batch_config: DynamicBatchConfig | None = None


@dataclass
class DecodingBaseConfig:
    max_draft_len: int | None = None
    speculative_model_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    decoding_type: ClassVar[str] = "Base"

    @staticmethod
    def from_dict(data: dict[str, Any]) -> DecodingBaseConfig:
        kinds = {"Eagle": EagleDecodingConfig, "Eagle3": EagleDecodingConfig, "MTP": MTPDecodingConfig,
                 "NGram": NGramDecodingConfig}
        data = dict(data)
        kind = data.pop("decoding_type", None)
        if kind not in kinds:
            raise ValueError(f"Invalid decoding type: {kind}")
        known = {"max_draft_len", "speculative_model_dir"}
        return kinds[kind](**{k: v for k, v in data.items() if k in known},
                           extra={k: v for k, v in data.items() if k not in known})


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Eagle"


class MTPDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "MTP"


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "NGram"


def check_speculative(value: Any) -> None:
    if value is None or isinstance(value, DecodingBaseConfig):
        return
    if isinstance(value, dict) and SURFACE.speculative_dict:
        DecodingBaseConfig.from_dict(value)
        return
    raise ValueError("1 validation error for TorchLlmArgs\nspeculative_config\n  Input should be a valid "
                     "dictionary or instance of EagleDecodingConfig "
                     f"[type=model_type, input_type={type(value).__name__}]")


def check_scheduler(value: Any) -> None:
    if value is None or isinstance(value, SchedulerConfig):
        return
    check_nested("scheduler_config", value)
    policy = value.get("capacity_scheduler_policy", "GUARANTEED_NO_EVICT")
    if str(getattr(policy, "value", policy)) not in CAPACITY_SCHEDULER_POLICIES:
        raise ValueError(f"1 validation error for SchedulerConfig\ncapacity_scheduler_policy\n  Input should be one of "
                         f"{CAPACITY_SCHEDULER_POLICIES}")
    batch = value.get("dynamic_batch_config")
    if isinstance(batch, dict) and set(batch) - DYNAMIC_BATCH_KEYS:
        raise ValueError(f"1 validation error for DynamicBatchConfig\n{min(set(batch) - DYNAMIC_BATCH_KEYS)}\n"
                         "  Extra inputs are not permitted")


def check_nested(name: str, value: Any) -> None:
    if value is None or not isinstance(value, dict):
        return
    for key in value:
        if key not in NESTED[name]:
            raise ValueError(f"1 validation error for {name}\n{key}\n  Extra inputs are not permitted")
    if name == "moe_config" and value.get("backend", "CUTLASS") not in MOE_BACKENDS:
        raise ValueError(f"1 validation error for MoeConfig\nbackend\n  Input should be one of {sorted(MOE_BACKENDS)}")
    fraction = value.get("free_gpu_memory_fraction") if name == "kv_cache_config" else None
    if fraction is not None and not 0 <= fraction <= 1:
        raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")


GUIDED_DECODING_BACKENDS = ("xgrammar", "llguidance")


def check_guided_decoding(arguments: dict[str, Any]) -> str | None:
    """`guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = None`, and (1.0 era,
    py_executor_creator.py) no guided decoding together with speculative decoding."""
    backend = arguments.get("guided_decoding_backend")
    if backend is not None and backend not in GUIDED_DECODING_BACKENDS:
        raise ValueError(f"1 validation error for TorchLlmArgs\nguided_decoding_backend\n  Input should be 'xgrammar' "
                         f"or 'llguidance' [type=literal_error, input_value={backend!r}, input_type=str]")
    if backend and arguments.get("speculative_config") and not SURFACE.guided_with_speculation:
        raise ValueError("Guided decoding is not supported with speculative decoding.")
    return backend
