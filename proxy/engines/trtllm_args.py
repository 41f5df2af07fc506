"""trtllm-serve's command-line flags and `--extra_llm_api_options` YAML, turned into `tensorrt_llm.LLM` arguments.

Mirrors trtllm-serve (tensorrt_llm/commands/serve.py, `get_llm_args` then `update_llm_args_with_extra_dict`, the
same in every release from the gpt-oss-dev container to 2026 main):
- the flags build the arguments, with trtllm-serve's defaults: `max_batch_size` 2048, `max_num_tokens` 8192,
  `max_beam_width` 1, `kv_cache_config.free_gpu_memory_fraction` 0.9, and its scheduler settings
  (GUARANTEED_NO_EVICT, batch-size tuning over a moving window of 128);
- the YAML's keys then replace them whole (`llm_args | yaml`): the YAML wins over flags given on the command line,
  and a YAML `kv_cache_config` replaces the one the flags built;
- `--set PATH=VALUE` (2026 trtllm-serve) sets one nested argument, after the YAML.

A flag whose LLM argument the installed release lacks is refused (that release's trtllm-serve has no such flag
either). trtllm-serve has no flag for `guided_decoding_backend` (only the YAML key, default unset: constraints
then go unenforced); ours, `--guided-decoding-backend`, defaults to `auto`: the YAML's choice, else llguidance.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("harmony_proxy")

GUIDED_DECODING_BACKENDS = ("auto", "llguidance", "xgrammar", "none")
DEFAULT_GUIDED_DECODING_BACKEND = "llguidance"  # takes our grammar in the same form in every release
GPT_OSS_CONTEXT = 131072  # gpt-oss's max_position_embeddings: the max_seq_len TensorRT-LLM deduces

# trtllm-serve's flags (dest names) and the LLM argument each sets; dest is the flag without its dashes.
FLAG_ARGUMENTS = {
    "tokenizer": "tokenizer",
    "custom_tokenizer": "custom_tokenizer",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "cp_size": "context_parallel_size",
    "ep_size": "moe_expert_parallel_size",
    "cluster_size": "moe_cluster_parallel_size",
    "gpus_per_node": "gpus_per_node",
    "max_beam_width": "max_beam_width",
    "max_batch_size": "max_batch_size",
    "max_num_tokens": "max_num_tokens",
    "max_seq_len": "max_seq_len",
    "trust_remote_code": "trust_remote_code",
    "revision": "revision",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "enable_attention_dp": "enable_attention_dp",
    "fail_fast_on_attention_window_too_large": "fail_fast_on_attention_window_too_large",
    "otlp_traces_endpoint": "otlp_traces_endpoint",
}
TRTLLM_SERVE_DEFAULTS: dict[str, Any] = {
    "max_batch_size": 2048,
    "max_num_tokens": 8192,
    "max_beam_width": 1,
    "kv_cache_config": {"free_gpu_memory_fraction": 0.9},
    "scheduler_config": {
        "capacity_scheduler_policy": "GUARANTEED_NO_EVICT",
        "dynamic_batch_config": {"enable_batch_size_tuning": True, "enable_max_num_tokens_tuning": False,
                                 "dynamic_batch_moving_average_window": 128},
    },
}


class LlmArgsError(ValueError):
    """The LLM arguments cannot be used; the message names the file and keys."""


@dataclass
class TrtllmFlags:
    """The trtllm-serve flags `harmony-proxy serve` was given; None (or absent) means not on the command line."""

    model: str
    backend: str = "pytorch"
    extra_llm_api_options: Path | None = None
    guided_decoding_backend: str | None = None  # one of GUIDED_DECODING_BACKENDS; None is auto
    kv_cache_free_gpu_memory_fraction: float | None = None
    flags: dict[str, Any] = field(default_factory=dict)  # FLAG_ARGUMENTS dest -> value
    settings: list[str] = field(default_factory=list)  # --set PATH=VALUE


def llm_arguments(flags: TrtllmFlags, known_keys: set[str] | None) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.LLM`; unknown YAML keys and flags the release lacks are errors naming them.

    `known_keys` is the set of argument names the installed TensorRT-LLM accepts (None: do not check here;
    the LLM constructor then rejects unknown names itself).
    """
    if flags.backend != "pytorch":
        raise LlmArgsError(f"--backend {flags.backend!r} is not supported: harmony-proxy runs the PyTorch backend")
    given = {FLAG_ARGUMENTS[dest]: value for dest, value in flags.flags.items() if value not in (None, False)}
    if known_keys is not None:
        missing = [dest for dest, value in flags.flags.items()
                   if value not in (None, False) and FLAG_ARGUMENTS[dest] not in known_keys]
        if missing:
            raise LlmArgsError(f"--{missing[0]} is not a flag of this TensorRT-LLM's trtllm-serve: the installed "
                               f"release has no LLM argument {FLAG_ARGUMENTS[missing[0]]}")
    arguments: dict[str, Any] = {"model": flags.model, "backend": "pytorch", **_copy(TRTLLM_SERVE_DEFAULTS), **given}
    if flags.kv_cache_free_gpu_memory_fraction is not None:
        arguments["kv_cache_config"] = {"free_gpu_memory_fraction": flags.kv_cache_free_gpu_memory_fraction}
        given["kv_cache_config"] = arguments["kv_cache_config"]
    extra = _read_yaml(flags.extra_llm_api_options) if flags.extra_llm_api_options else {}
    if known_keys is not None:
        unknown = sorted(set(extra) - known_keys)
        if unknown:
            raise LlmArgsError(
                f"{flags.extra_llm_api_options}: unknown LLM argument(s) {', '.join(unknown)} "
                "(not accepted by the installed TensorRT-LLM)"
            )
    overridden = sorted(key for key in extra if key in given)
    if overridden:
        logger.warning("%s overrides the command line's %s, as trtllm-serve's YAML does", flags.extra_llm_api_options,
                       ", ".join(overridden))
    arguments.update(extra)
    for setting in flags.settings:
        _apply_setting(arguments, setting, known_keys)
    backend = _guided_decoding_backend(flags.guided_decoding_backend or "auto", arguments)
    arguments.pop("guided_decoding_backend", None)
    if backend is not None:
        arguments["guided_decoding_backend"] = backend
    return arguments


def engine_context(arguments: dict[str, Any]) -> tuple[int, int]:
    """(context, longest prompt): what the engine these arguments build will take, prompt plus output and prompt.

    TensorRT-LLM deduces `max_seq_len` from the model (131072 for gpt-oss); without chunked prefill it refuses a
    prompt longer than `max_num_tokens` (llm.py `_check_arguments`).
    """
    context = int(arguments.get("max_seq_len") or GPT_OSS_CONTEXT)
    if arguments.get("enable_chunked_prefill"):
        return context, context
    return context, min(context, int(arguments.get("max_num_tokens") or TRTLLM_SERVE_DEFAULTS["max_num_tokens"]))


def _apply_setting(arguments: dict[str, Any], setting: str, known_keys: set[str] | None) -> None:
    """`--set kv_cache_config.enable_block_reuse=false`: the value read as YAML, the path created as needed."""
    import yaml

    path, sep, text = setting.partition("=")
    keys = path.strip().split(".")
    if not sep or not all(keys):
        raise LlmArgsError(f"--set {setting!r}: expected PATH=VALUE, e.g. kv_cache_config.enable_block_reuse=false")
    if known_keys is not None and keys[0] not in known_keys:
        raise LlmArgsError(f"--set {setting!r}: unknown LLM argument {keys[0]} (not accepted by the installed "
                           "TensorRT-LLM)")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LlmArgsError(f"--set {setting!r}: the value is not valid YAML: {exc}") from None
    holder = arguments
    for key in keys[:-1]:
        if not isinstance(holder.get(key), dict):
            holder[key] = {}
        holder = holder[key]
    holder[keys[-1]] = value


def _guided_decoding_backend(choice: str, arguments: dict[str, Any]) -> str | None:
    """The LLM's guided decoding backend: the flag's, else the YAML's, else llguidance.

    Not by default with speculative decoding: TensorRT-LLM 1.0 refuses to build an LLM with both (the engine
    says at start-up that constraints are then not enforced, and how to turn them on).
    """
    if choice not in GUIDED_DECODING_BACKENDS:
        raise LlmArgsError(f"--guided-decoding-backend must be one of {', '.join(GUIDED_DECODING_BACKENDS)}")
    if choice == "none":
        return None
    if choice != "auto":
        return choice
    if arguments.get("guided_decoding_backend") is not None or arguments.get("speculative_config"):
        return arguments.get("guided_decoding_backend")
    logger.info("guided_decoding_backend: llguidance, where trtllm-serve leaves it unset (and ignores "
                "constraints): TensorRT-LLM then builds llguidance's tokenizer of the 201k-token vocabulary at "
                "start-up, and each step of a batch with a constrained request computes and applies that "
                "request's token mask on the CPU; --guided-decoding-backend none serves as trtllm-serve does")
    return DEFAULT_GUIDED_DECODING_BACKEND


def _copy(value: Any) -> Any:
    return {key: _copy(item) for key, item in value.items()} if isinstance(value, dict) else value


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml  # needed only with TensorRT-LLM, which depends on it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LlmArgsError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise LlmArgsError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LlmArgsError(f"{path} must be a mapping of LLM arguments")
    return data
