"""trtllm-serve's command-line flags and `--extra_llm_api_options` YAML, turned into `tensorrt_llm.LLM` arguments.

Mirrors trtllm-serve (tensorrt_llm/commands/serve.py, 1.1 to 1.3): `--tp_size` is `tensor_parallel_size`,
`--ep_size` is `moe_expert_parallel_size`, `--kv_cache_free_gpu_memory_fraction` is
`kv_cache_config.free_gpu_memory_fraction`. The YAML's keys are LLM arguments too; flags given on the command
line win over the YAML (newest trtllm-serve), and `kv_cache_config` is merged key by key.

trtllm-serve has no flag for `guided_decoding_backend` (only the YAML key, default unset: constraints then go
unenforced); ours, `--guided-decoding-backend`, defaults to `auto`: the YAML's choice, else llguidance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

GUIDED_DECODING_BACKENDS = ("auto", "llguidance", "xgrammar", "none")
DEFAULT_GUIDED_DECODING_BACKEND = "llguidance"  # takes our grammar in the same form in every release


class LlmArgsError(ValueError):
    """The LLM arguments cannot be used; the message names the file and keys."""


@dataclass
class TrtllmFlags:
    """The trtllm-serve flags `harmony-proxy serve` accepts; None means not given on the command line."""

    model: str
    tokenizer: str | None = None
    backend: str = "pytorch"
    tp_size: int | None = None
    pp_size: int | None = None
    ep_size: int | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None
    trust_remote_code: bool = False
    extra_llm_api_options: Path | None = None
    guided_decoding_backend: str | None = None  # one of GUIDED_DECODING_BACKENDS; None is auto


def llm_arguments(flags: TrtllmFlags, known_keys: set[str] | None) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.LLM`; unknown YAML keys are an error naming them.

    `known_keys` is the set of argument names the installed TensorRT-LLM accepts (None: do not check here;
    the LLM constructor then rejects unknown names itself).
    """
    if flags.backend != "pytorch":
        raise LlmArgsError(f"--backend {flags.backend!r} is not supported: harmony-proxy runs the PyTorch backend")
    extra = _read_yaml(flags.extra_llm_api_options) if flags.extra_llm_api_options else {}
    if known_keys is not None:
        unknown = sorted(set(extra) - known_keys)
        if unknown:
            raise LlmArgsError(
                f"{flags.extra_llm_api_options}: unknown LLM argument(s) {', '.join(unknown)} "
                "(not accepted by the installed TensorRT-LLM)"
            )
    arguments: dict[str, Any] = {"model": flags.model, "backend": "pytorch", **extra}
    from_flags = {
        "tokenizer": flags.tokenizer,
        "tensor_parallel_size": flags.tp_size,
        "pipeline_parallel_size": flags.pp_size,
        "moe_expert_parallel_size": flags.ep_size,
        "max_batch_size": flags.max_batch_size,
        "max_num_tokens": flags.max_num_tokens,
        "max_seq_len": flags.max_seq_len,
        "trust_remote_code": flags.trust_remote_code or None,
    }
    arguments.update({key: value for key, value in from_flags.items() if value is not None})
    if flags.kv_cache_free_gpu_memory_fraction is not None:
        kv_cache = dict(arguments.get("kv_cache_config") or {})
        kv_cache["free_gpu_memory_fraction"] = flags.kv_cache_free_gpu_memory_fraction
        arguments["kv_cache_config"] = kv_cache
    backend = _guided_decoding_backend(flags.guided_decoding_backend or "auto", arguments)
    arguments.pop("guided_decoding_backend", None)
    if backend is not None:
        arguments["guided_decoding_backend"] = backend
    return arguments


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
    return DEFAULT_GUIDED_DECODING_BACKEND


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
