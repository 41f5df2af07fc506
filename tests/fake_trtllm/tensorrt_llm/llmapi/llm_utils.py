"""tensorrt_llm/llmapi/llm_utils.py (2026: llm_args.py): `update_llm_args_with_extra_dict`, how trtllm-serve applies
the YAML to the arguments its flags built.

- Until 1.3.0rc19 (1.0 era id 1520735490 off. 92185; late 2025 id 1090804222): `llm_args | yaml`, the YAML wins
  and a YAML `kv_cache_config` replaces the flag-built one; field_mapping turns the YAML's dicts into classes,
  `speculative_config` through `DecodingBaseConfig.from_dict`.
- From 1.3.0rc19 (PR #14812; id 55143598664 tail): `explicit_cli_keys` (flags typed on the command line) win over
  the YAML; `kv_cache_config` is deep-merged, an explicit `--free_gpu_memory_fraction` / `--kv_cache_dtype` kept;
  `telemetry_config` merged likewise; `hf_revision` read as `revision`; `speculative_config` is not converted (a
  discriminated union validates the dict).
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm._surface import SURFACE
from tensorrt_llm.llmapi.llm_args import (
    AttentionDpConfig,
    BuildConfig,
    DecodingBaseConfig,
    KvCacheConfig,
    MoeConfig,
    TelemetryConfig,
)

_CLI_TO_KV_CACHE = {"free_gpu_memory_fraction": "free_gpu_memory_fraction", "kv_cache_dtype": "dtype"}


def update_llm_args_with_extra_dict(llm_args: dict[str, Any], llm_args_dict: dict[str, Any] | None,
                                    extra_llm_api_options: str | None = None,
                                    explicit_cli_keys: set[str] | None = None) -> dict[str, Any]:
    llm_args_dict = dict(llm_args_dict or {})
    mapping: dict[str, Any] = {"build_config": BuildConfig, "moe_config": MoeConfig,
                               "attention_dp_config": AttentionDpConfig}
    if SURFACE.cli_wins:
        explicit = explicit_cli_keys or set()
        if "hf_revision" in llm_args_dict:
            llm_args_dict.setdefault("revision", llm_args_dict.pop("hf_revision"))
        for name, model in (("kv_cache_config", KvCacheConfig), ("telemetry_config", TelemetryConfig)):
            if name in llm_args and name in llm_args_dict and isinstance(llm_args_dict[name], dict):
                base = llm_args[name]
                base = base.model_dump(exclude_unset=True) if isinstance(base, model) else dict(base)
                merged = base | llm_args_dict[name]
                for cli, field in _CLI_TO_KV_CACHE.items():
                    if name == "kv_cache_config" and cli in explicit and field in base:
                        merged[field] = base[field]
                if name == "telemetry_config" and "telemetry" in explicit and "disabled" in base:
                    merged["disabled"] = base["disabled"]
                llm_args_dict[name] = merged
        llm_args_dict = {key: value for key, value in llm_args_dict.items() if key not in explicit}
        mapping |= {"kv_cache_config": KvCacheConfig, "telemetry_config": TelemetryConfig}
    elif isinstance(llm_args_dict.get("speculative_config"), dict):
        llm_args_dict["speculative_config"] = DecodingBaseConfig.from_dict(llm_args_dict["speculative_config"])
    for name, model in mapping.items():
        if isinstance(llm_args_dict.get(name), dict):
            llm_args_dict[name] = model(**llm_args_dict[name])
    return llm_args | llm_args_dict
