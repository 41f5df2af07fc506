"""tensorrt_llm/llmapi/llm_args.py, reduced to what argument checking needs: the field names and the strict
(extra="forbid") nested configs. Pydantic raises ValidationError, a ValueError, for an unknown nested key."""

from __future__ import annotations

from typing import Any

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


class TorchLlmArgs:
    model_fields = _Fields({
        "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code", "tensor_parallel_size",
        "dtype", "revision", "tokenizer_revision", "pipeline_parallel_size", "context_parallel_size",
        "moe_expert_parallel_size", "moe_tensor_parallel_size", "gpus_per_node", "enable_attention_dp",
        "max_batch_size", "max_num_tokens", "max_seq_len", "max_input_len", "max_beam_width", "kv_cache_config",
        "enable_chunked_prefill", "guided_decoding_backend", "num_postprocess_workers", "postprocess_tokenizer_dir",
        "reasoning_parser", "scheduler_config", "cache_transceiver_config", "speculative_config", "backend",
        "cuda_graph_config", "attention_dp_config", "disable_overlap_scheduler", "moe_config", "attn_backend",
        "sampler_type", "print_iter_log", "enable_iter_perf_stats", "stream_interval", "torch_compile_config",
        "enable_autotuner", "load_format", "batch_wait_timeout_ms", "checkpoint_format",
    })


NESTED: dict[str, set[str]] = {
    "kv_cache_config": {"enable_block_reuse", "max_tokens", "free_gpu_memory_fraction", "host_cache_size",
                        "enable_partial_reuse", "copy_on_partial_reuse", "dtype", "tokens_per_block"},
    "cuda_graph_config": {"batch_sizes", "max_batch_size", "enable_padding"},
    "moe_config": {"backend", "max_num_tokens", "load_balancer", "disable_finalize_fusion"},
    "attention_dp_config": {"enable_balance", "timeout_iters", "batching_wait_iters"},
}
MOE_BACKENDS = {"AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"}


def check_nested(name: str, value: Any) -> None:
    if value is None or not isinstance(value, dict):
        return
    for key in value:
        if key not in NESTED[name]:
            raise ValueError(f"1 validation error for {name}\n{key}\n  Extra inputs are not permitted")
    if name == "moe_config" and value.get("backend", "AUTO") not in MOE_BACKENDS:
        raise ValueError(f"1 validation error for MoeConfig\nbackend\n  Input should be one of {sorted(MOE_BACKENDS)}")
    fraction = value.get("free_gpu_memory_fraction") if name == "kv_cache_config" else None
    if fraction is not None and not 0 <= fraction <= 1:
        raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")


GUIDED_DECODING_BACKENDS = ("xgrammar", "llguidance")


def check_guided_decoding(arguments: dict[str, Any]) -> str | None:
    """`guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = None`, and (oldest surface,
    py_executor_creator.py) no guided decoding together with speculative decoding."""
    backend = arguments.get("guided_decoding_backend")
    if backend is not None and backend not in GUIDED_DECODING_BACKENDS:
        raise ValueError(f"1 validation error for TorchLlmArgs\nguided_decoding_backend\n  Input should be 'xgrammar' "
                         f"or 'llguidance' [type=literal_error, input_value={backend!r}, input_type=str]")
    if backend and arguments.get("speculative_config") and not SURFACE.guided_with_speculation:
        raise ValueError("Guided decoding is not supported with speculative decoding.")
    return backend
