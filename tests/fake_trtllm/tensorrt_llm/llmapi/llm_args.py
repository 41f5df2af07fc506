"""tensorrt_llm/llmapi/llm_args.py, reduced to what trtllm-serve and the LLM need: strict (extra="forbid") pydantic
classes with each release's fields. Read from: the 1.0 era, id 1520735490 (July 2025); late 2025, id 1090804222;
2026, ids 7019226376 and 55143598664 (1.3.0rc19+: `update_llm_args_with_extra_dict(..., explicit_cli_keys)`);
newest TorchLlmArgs field list, the telemetry manifest id 65725202794 (1.4). Our reading: each field cites where.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from tensorrt_llm._surface import SURFACE

R = SURFACE.release


class StrictBaseModel(BaseModel):  # `class Config: extra = "forbid"` (id 1520735490 off. 4067)
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class CapacitySchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class KvCacheConfig(StrictBaseModel):
    # 1.0-era fields (id 1520735490 off. ~33000); event_buffer_max_size in every version read (ids 1520735490,
    # 1090804222, 7019226376); tokens_per_block only in 2026 (id 7019226376), not on 1.0.
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    dtype: str = "auto"
    if R >= 3:
        tokens_per_block: int = 32

    @field_validator("free_gpu_memory_fraction")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= 1:
            raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")
        return value


class DynamicBatchConfig(StrictBaseModel):
    # 1.0 era: every field required (id 1520735490 off. 26763); 2026: defaults True/False/128 (id 7019226376)
    if R >= 3:
        enable_batch_size_tuning: bool = True
        enable_max_num_tokens_tuning: bool = False
        dynamic_batch_moving_average_window: int = 128
    else:
        enable_batch_size_tuning: bool
        enable_max_num_tokens_tuning: bool
        dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: Literal["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"] | None = None
    dynamic_batch_config: DynamicBatchConfig | None = None
    if R >= 3:  # 2026 (id 7019226376): waiting_queue_policy, use_python_scheduler (#11884), prefix-aware
        waiting_queue_policy: Literal["fcfs", "priority"] = "fcfs"
        use_python_scheduler: bool = False
        enable_prefix_aware_scheduling: bool = False


# MoE backends: 1.0 era (id 1520735490 off. ~6000); 1.1/1.2 add TRITON (create_moe.py @9c6caaa1); 1.3.0rc19+
# (id 55143598664 off. 54344, default AUTO); 1.4.0rc1 docs: no WIDEEP, CUTEDSL_FC12 and MEGAMOE_CUTEDSL added.
_MOE = {
    0: ("CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA"),
    1: ("CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"),
    3: ("AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON", "MARLIN",
        "MEGAMOE_DEEPGEMM"),
    4: ("AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON",
        "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL"),
}
MOE_BACKENDS = _MOE[max(key for key in _MOE if key <= R)]


class MoeConfig(StrictBaseModel):
    backend: Literal[MOE_BACKENDS] = "AUTO" if R >= 3 else "CUTLASS"  # type: ignore[valid-type]
    max_num_tokens: int | None = None
    load_balancer: Any | None = None
    if R >= 2:
        disable_finalize_fusion: bool = False


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: list[int] | None = None
    max_batch_size: int = 0
    enable_padding: bool = False


class AttentionDpConfig(StrictBaseModel):
    enable_balance: bool = False
    timeout_iters: int = 50
    batching_wait_iters: int = 10


class BuildConfig(StrictBaseModel):  # trtllm-serve's defaults come from here (serve.py @4c05a748, id 59682888564)
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_beam_width: int = 1
    max_seq_len: int | None = None


class TelemetryConfig(StrictBaseModel):  # 2026 (id 55143598664 tail: merged with --telemetry/--no-telemetry)
    disabled: bool = False
    usage_context: str | None = None


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: int | None = None
    speculative_model_dir: str | None = None
    if R <= 2:  # a ClassVar until 2026: a plain dict does not validate; trtllm-serve converts it with from_dict
        decoding_type: ClassVar[str] = "Base"

        @staticmethod
        def from_dict(data: dict[str, Any]) -> DecodingBaseConfig:  # id 1520735490 off. ~12373, id 1090804222
            kinds = {"Eagle": EagleDecodingConfig, "Eagle3": EagleDecodingConfig, "MTP": MTPDecodingConfig,
                     "NGram": NGramDecodingConfig}
            data = dict(data)
            kind = data.pop("decoding_type", None)
            if kind not in kinds:
                raise ValueError(f"Invalid decoding type: {kind}")
            return kinds[kind](**data)


class EagleDecodingConfig(DecodingBaseConfig):
    eagle3_one_model: bool | None = True
    num_eagle_layers: int | None = None
    if R >= 3:  # 2026: decoding_type is a field, the union discriminated on it (1.3.0rc27 docs)
        decoding_type: Literal["Eagle", "Eagle3"] = "Eagle"
    else:
        decoding_type: ClassVar[str] = "Eagle"


class MTPDecodingConfig(DecodingBaseConfig):
    num_nextn_predict_layers: int = 1
    if R >= 3:
        decoding_type: Literal["MTP"] = "MTP"
    else:
        decoding_type: ClassVar[str] = "MTP"


class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = 0
    if R >= 3:
        decoding_type: Literal["NGram"] = "NGram"
    else:
        decoding_type: ClassVar[str] = "NGram"


if R >= 3:
    Speculative = Annotated[EagleDecodingConfig | MTPDecodingConfig | NGramDecodingConfig,
                            Field(discriminator="decoding_type")] | None
else:
    Speculative = EagleDecodingConfig | MTPDecodingConfig | NGramDecodingConfig | None

_ANY = (Any | None, None)
_FIELDS: dict[str, Any] = {  # in every release read (ids 1520735490 .. 65725202794)
    "model": (str, ...), "tokenizer": _ANY, "tokenizer_mode": (str, "auto"), "skip_tokenizer_init": (bool, False),
    "trust_remote_code": (bool, False), "tensor_parallel_size": (int, 1), "dtype": (str, "auto"),
    "revision": _ANY, "tokenizer_revision": _ANY, "pipeline_parallel_size": (int, 1),
    "context_parallel_size": (int, 1), "moe_expert_parallel_size": (int | None, None),
    "moe_tensor_parallel_size": (int | None, None), "moe_cluster_parallel_size": (int | None, None),
    "gpus_per_node": (int | None, None), "enable_attention_dp": (bool, False), "cp_config": _ANY,
    "max_batch_size": (int | None, 2048), "max_num_tokens": (int | None, 8192),
    "max_seq_len": (int | None, None), "max_input_len": (int | None, None), "max_beam_width": (int, 1),
    "kv_cache_config": (KvCacheConfig, Field(default_factory=KvCacheConfig)),
    "enable_chunked_prefill": (bool, False),
    "guided_decoding_backend": (Literal["xgrammar", "llguidance"] | None, None),
    "num_postprocess_workers": (int, 0), "postprocess_tokenizer_dir": (str | None, None),
    "reasoning_parser": (str | None, None),
    "scheduler_config": (SchedulerConfig, Field(default_factory=SchedulerConfig)),
    "cache_transceiver_config": _ANY, "speculative_config": (Speculative, None),
    "cuda_graph_config": (CudaGraphConfig | None, None), "attention_dp_config": (AttentionDpConfig | None, None),
    "disable_overlap_scheduler": (bool, False), "moe_config": (MoeConfig, Field(default_factory=MoeConfig)),
    "attn_backend": (str, "TRTLLM"), "print_iter_log": (bool, False), "enable_iter_perf_stats": (bool, False),
    "stream_interval": (int, 1), "torch_compile_config": _ANY, "enable_autotuner": (bool, True),
    "load_format": (str, "auto"), "batch_wait_timeout_ms": (float, 0),
}
_BY_RELEASE: dict[int, dict[str, Any]] = {
    # 1.0: enable_trtllm_sampler and enable_mixed_sampler (id 1520735490 off. 79277); build_config, which
    # trtllm-serve passes to the PyTorch LLM until 2026 (serve.py @4c05a748); fail_fast_... in BaseLlmArgs
    # (id 1520735490 off. 42999)
    0: {"enable_trtllm_sampler": (bool, False), "enable_mixed_sampler": (bool, False), "build_config": _ANY,
        "fail_fast_on_attention_window_too_large": (bool, False)},
    1: {"sampler_type": (Literal["TRTLLMSampler", "TorchSampler", "auto"], "auto")},  # PR #6831
    2: {"otlp_traces_endpoint": (str | None, None), "checkpoint_format": (str | None, None)},
    # 2026 (ids 7019226376, 55143598664): NVIDIA's H200 gpt-oss configs use env_overrides; generation_config #17213
    3: {"custom_tokenizer": (str | None, None), "env_overrides": (dict[str, Any] | None, None),
        "generation_config": (Literal["auto", "trtllm"], "auto"),
        "telemetry_config": (TelemetryConfig, Field(default_factory=TelemetryConfig))},
    4: {"num_serve_frontends": (int, 1)},  # manifest id 56922583192
}
_REMOVED = {
    1: {"enable_trtllm_sampler", "enable_mixed_sampler"},  # PR #7294
    # 2026 serve.py pops build_config for PyTorch (id 59682888564); fail_fast_... moved beside the TRT-only
    # `workspace` (id 7019226376 off. 99420)
    3: {"build_config", "fail_fast_on_attention_window_too_large"},
    4: {"sampler_type"},  # PR #18232
}


def _fields(release: int) -> dict[str, Any]:
    fields = dict(_FIELDS)
    for step in range(release + 1):
        fields |= _BY_RELEASE.get(step, {})
        for name in _REMOVED.get(step, ()):
            fields.pop(name, None)
    return fields


TorchLlmArgs = create_model("TorchLlmArgs", __base__=StrictBaseModel, **_fields(R))
