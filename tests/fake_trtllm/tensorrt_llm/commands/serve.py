"""tensorrt_llm/commands/serve.py: trtllm-serve's `serve` command, per release (our reading; sources cited).

- 1.0 to 1.2 (`release` 0-2): serve.py @4c05a748 (id 901178132). `get_llm_args` passes every flag, with
  BuildConfig's defaults (max_batch_size 2048, max_num_tokens 8192, max_beam_width 1), a `build_config`, a
  `KvCacheConfig(free_gpu_memory_fraction)` and `SchedulerConfig(GUARANTEED_NO_EVICT, DynamicBatchConfig(True,
  False, 128))` for every backend. `--cluster_size` lands in the unused extra dict (ignored). The gpt-oss-dev/1.0
  surface lacks `--disagg_cluster_uri` and `--media_io_kwargs` (later additions; 1.0's serve.py was not read).
- 1.3.0rc19+ and 1.4 (`release` 3-4): serve.py id 59682888564 (2026) and PR #14812. Only arguments that differ
  from TorchLlmArgs' defaults are passed (`is_non_default_or_required`); no scheduler_config or build_config on
  PyTorch; `--cluster_size` warned and dropped; `--fail_fast_on_attention_window_too_large` default True, passed
  only where the LLM has the field; new flags `--kv_cache_dtype`, `--served_model_name`, `--hf_revision`,
  `--config`, `--tool_parser`, `--grpc`, `--telemetry/--no-telemetry`; explicit flags win over the YAML. 1.4 adds
  `--num_serve_frontends` (multi-frontend serving, id 68716330170).
- `launch_server(host, port, llm_args, ...)` builds `LLM(**llm_args)` and hands it to `OpenAIServer` (`llm=`
  before 2026, `generator=` after); 2026 binds the socket first (id 59682888564: "Failed to bind socket", and
  `port > 0` asserted). `OpenAIServer` serves a local model directory under its folder name (`model_dir.name`,
  every version read; 2026 id 54820179511).
- 1.4: `--grpc`'s launcher is imported inside `serve()` (issue 33's reading of 2026 main; here
  `tensorrt_llm.grpc.openengine.server`), not a module-level `launch_*`; `--middleware` (repeatable) is applied to
  the server's `app` once it is made; `--fail_fast_on_attention_window_too_large` is gone; with
  `num_serve_frontends` > 1 the launcher spawns the other front ends once the LLM is built (PR #16523: they re-run
  the command line; recorded here as `spawn_frontends`).
- Open PRs (surfaces `1.4+prN`, see _surface.py): #19379 `--num_serve_frontends` defaults to 8; #17787
  `OpenAIServer(generator_factory=...)`; #16939 `OpenAIServer(generator=None)` then `serve_with_lifecycle(build)`.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import click
import yaml
from click.core import ParameterSource

from tensorrt_llm._surface import SURFACE
from tensorrt_llm.llmapi import LLM as PyTorchLLM
from tensorrt_llm.llmapi.llm_args import (
    BuildConfig,
    CapacitySchedulerPolicy,
    DynamicBatchConfig,
    KvCacheConfig,
    SchedulerConfig,
    TelemetryConfig,
    TorchLlmArgs,
)
from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
from tensorrt_llm.serve import OpenAIServer

R = SURFACE.release
NEW = R >= 3
PR = SURFACE.open_pr


def get_llm_args(model: str, backend: str = "pytorch", free_gpu_memory_fraction: float = 0.9,
                 kv_cache_dtype: str = "auto", **flags: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    build = BuildConfig.model_fields
    for name in ("max_beam_width", "max_batch_size", "max_num_tokens", "max_seq_len"):
        if flags.get(name) is None:
            flags[name] = build[name].default
    flags["gpus_per_node"] = flags.get("gpus_per_node") or 1  # torch.cuda.device_count() on a GPU machine
    extra = {"moe_cluster_parallel_size": flags.pop("moe_cluster_parallel_size", None)}  # dropped by serve
    tokenizer = flags.get("tokenizer")
    if not NEW:
        return {"model": model, "backend": backend, "postprocess_tokenizer_dir": tokenizer or model,
                "scheduler_config": SchedulerConfig(
                    capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
                    dynamic_batch_config=DynamicBatchConfig(enable_batch_size_tuning=True,
                                                            enable_max_num_tokens_tuning=False,
                                                            dynamic_batch_moving_average_window=128)),
                "build_config": BuildConfig(**{name: flags[name] for name in build}),
                "kv_cache_config": KvCacheConfig(free_gpu_memory_fraction=free_gpu_memory_fraction),
                **flags}, extra
    kv_default = KvCacheConfig.model_fields["free_gpu_memory_fraction"].default
    maybe = {"model": model, "backend": backend, "postprocess_tokenizer_dir": tokenizer or model,
             "kv_cache_config": KvCacheConfig(free_gpu_memory_fraction=free_gpu_memory_fraction, dtype=kv_cache_dtype)
             if free_gpu_memory_fraction != kv_default or kv_cache_dtype != "auto" else None, **flags}
    always = {"model", "backend", "tokenizer", "custom_tokenizer", "postprocess_tokenizer_dir"}

    def wanted(name: str, value: Any) -> bool:  # is_non_default_or_required
        if name in always:
            return True
        field = TorchLlmArgs.model_fields.get(name)
        return value is not None and field is not None and value != field.get_default(call_default_factory=True)

    return {name: value for name, value in maybe.items() if wanted(name, value)}, extra


def launch_server(host: str, port: int, llm_args: dict[str, Any], tool_parser: str | None = None,
                  metadata_server_cfg: Any = None, server_role: Any = None, disagg_cluster_config: Any = None,
                  served_model_name: str | None = None, middlewares: list[str] | None = None) -> None:
    model = served_model_name or llm_args["model"]
    if NEW:
        assert port > 0 or disagg_cluster_config is not None, "Port must be specified if disagg cluster config is " \
            "not provided"
        with socket.socket() as bound:
            try:
                bound.bind((host, port))
            except OSError as exc:
                raise RuntimeError(f"Failed to bind socket to {host}:{port}: {exc}") from None
            _serve(host, port, llm_args, model, tool_parser, middlewares or [])
    else:
        _serve(host, port, llm_args, model, tool_parser, [])


def _serve(host: str, port: int, llm_args: dict[str, Any], model: str, tool_parser: str | None,
           middlewares: list[str]) -> None:
    llm_args.pop("build_config", None) if NEW else None
    if PR == 17787:  # the server builds the LLM
        server = OpenAIServer(generator_factory=lambda: _built(llm_args), model=model, tool_parser=tool_parser,
                              server_role=None)
    elif PR == 16939:  # the server first, serving 503 while the LLM builds
        server = OpenAIServer(generator=None, model=model, tool_parser=tool_parser, server_role=None)
        asyncio.run(server.serve_with_lifecycle(host, port, build=lambda: _built(llm_args)))
        return
    else:
        llm = _built(llm_args)
        given = {"generator": llm, "server_role": None} if NEW else {"llm": llm}
        server = OpenAIServer(model=model, tool_parser=tool_parser, **given)
    for name in middlewares:
        server.app.add_middleware(name)
    asyncio.run(server(host, port))


def _built(llm_args: dict[str, Any]) -> Any:
    llm = PyTorchLLM(**llm_args)
    if (llm_args.get("num_serve_frontends") or 1) > 1:
        llm._record("spawn_frontends", count=llm_args["num_serve_frontends"] - 1)  # PR #16523: re-run the command
    return llm


def get_is_diffusion_model(model: str) -> bool:
    """2026 serve() picks the visual generation server when this says so (id 59682888564); the real check is in
    tensorrt_llm/commands/utils.py (not read): here, a diffusers folder (`model_index.json`)."""
    return (Path(model) / "model_index.json").is_file()


def launch_visual_gen_server(host: str, port: int, model: str) -> None:
    from tensorrt_llm.llmapi import LLM

    generator = LLM(model)  # stands for VisualGen(model_path=model): something built, then a server role
    OpenAIServer(generator=generator, model=model, server_role="VISUAL_GEN", tool_parser=None)


def launch_grpc_server(host: str, port: int, llm_args: dict[str, Any], served_model_name: str | None = None) -> None:
    raise AssertionError("the fake has no gRPC server: harmony-proxy must refuse --grpc before this")


def _options(command: Any) -> Any:
    spelled = [
        (("--tokenizer",), {"type": str, "default": None}),
        (("--host",), {"type": str, "default": "localhost"}),
        (("--port",), {"type": int, "default": 8000}),
        (("--backend",), {"type": click.Choice(["pytorch", "tensorrt", "_autodeploy"]), "default": "pytorch"}),
        (("--log_level",), {"type": click.Choice(["internal_error", "error", "warning", "info", "verbose", "debug",
                                                 "trace"]), "default": "info"}),
        (("--max_beam_width",), {"type": int, "default": None if NEW else 1}),
        (("--max_batch_size",), {"type": int, "default": None if NEW else 2048}),
        (("--max_num_tokens",), {"type": int, "default": None if NEW else 8192}),
        (("--max_seq_len",), {"type": int, "default": None}),
        (("--tp_size", "tensor_parallel_size"), {"type": int, "default": 1}),
        (("--pp_size", "pipeline_parallel_size"), {"type": int, "default": 1}),
        (("--ep_size", "moe_expert_parallel_size"), {"type": int, "default": None}),
        (("--cluster_size", "moe_cluster_parallel_size"), {"type": int, "default": None}),
        (("--gpus_per_node",), {"type": int, "default": None}),
        (("--kv_cache_free_gpu_memory_fraction", "free_gpu_memory_fraction"), {"type": float, "default": 0.9}),
        (("--num_postprocess_workers",), {"type": int, "default": 0}),
        (("--trust_remote_code",), {"is_flag": True, "default": False}),
        (("--extra_llm_api_options",) + (("--config",) if NEW else ()), {"type": str, "default": None}),
        (("--reasoning_parser",), {"type": click.Choice(["deepseek-r1", "qwen3", "gpt_oss"]), "default": None}),
        (("--metadata_server_config_file",), {"type": str, "default": None}),
        (("--server_role",), {"type": str, "default": None}),
        (("--enable_chunked_prefill",), {"is_flag": True, "default": False}),
    ]
    if R <= 3:
        spelled += [(("--fail_fast_on_attention_window_too_large",), {"is_flag": True, "default": NEW})]
    if R >= 1:
        spelled += [(("--disagg_cluster_uri",), {"type": str, "default": None}),
                    (("--media_io_kwargs",), {"type": str, "default": None})]
    if NEW:
        spelled += [
            (("--custom_tokenizer",), {"type": str, "default": None}),
            (("--cp_size", "context_parallel_size"), {"type": int, "default": 1}),
            (("--kv_cache_dtype",), {"type": str, "default": "auto"}),
            (("--revision", "--hf_revision", "revision"), {"type": str, "default": None}),
            (("--tool_parser",), {"type": str, "default": None}),
            (("--otlp_traces_endpoint",), {"type": str, "default": None}),
            (("--enable_attention_dp",), {"is_flag": True, "default": False}),
            (("--chat_template",), {"type": str, "default": None}),
            (("--grpc",), {"is_flag": True, "default": False}),
            (("--served_model_name",), {"type": str, "default": None}),
            (("--telemetry/--no-telemetry",), {"default": True}),
        ]
    if R >= 4:
        spelled += [(("--num_serve_frontends",), {"type": int, "default": 8 if PR == 19379 else 1}),
                    (("--middleware",), {"type": str, "multiple": True, "default": ()})]
    for names, settings in reversed(spelled):
        command = click.option(*names, **settings)(command)
    return click.argument("model", type=str)(command)


@click.command("serve")
@_options
@click.pass_context
def serve(ctx: click.Context, model: str, host: str, port: int, log_level: str, extra_llm_api_options: str | None,
          metadata_server_config_file: str | None = None, server_role: str | None = None,
          disagg_cluster_uri: str | None = None, media_io_kwargs: str | None = None,
          tool_parser: str | None = None, chat_template: str | None = None, grpc: bool = False,
          served_model_name: str | None = None, telemetry: bool = True, num_serve_frontends: int = 1,
          middleware: tuple[str, ...] = (), **flags: Any) -> None:
    """Running an OpenAI API compatible server"""
    if NEW and get_is_diffusion_model(model):
        launch_visual_gen_server(host, port, model)
        return
    flags.pop("kv_cache_free_gpu_memory_fraction", None)
    if NEW:
        flags.pop("moe_cluster_parallel_size")  # "deprecated and no longer supported" (id 59682888564)
    llm_args, _ = get_llm_args(model, **flags)
    if NEW and not telemetry:
        llm_args["telemetry_config"] = TelemetryConfig(disabled=True)
    if R >= 4 and num_serve_frontends != 1:
        llm_args["num_serve_frontends"] = num_serve_frontends
    extra: dict[str, Any] = {}
    if extra_llm_api_options is not None:
        with open(extra_llm_api_options) as file:
            extra = yaml.safe_load(file)
    explicit = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    llm_args = update_llm_args_with_extra_dict(llm_args, extra, extra_llm_api_options,
                                               explicit_cli_keys=explicit if NEW else None)
    disagg = llm_args.pop("disagg_cluster", None) or disagg_cluster_uri
    if (metadata_server_config_file is not None or disagg) and server_role is None:
        raise AssertionError("server_role is required when metadata_server_cfg or disagg_cluster_config "
                             "is provided")
    role = server_role.upper() if server_role else None
    if grpc:
        if R >= 4:  # imported here, not a module-level name
            from tensorrt_llm.grpc.openengine.server import launch_server as launch_openengine
            launch_openengine(host, port, llm_args, served_model_name=served_model_name)
        else:
            launch_grpc_server(host, port, llm_args, served_model_name=served_model_name)
        return
    if R >= 4:
        launch_server(host, port, llm_args, tool_parser, metadata_server_config_file, role, disagg,
                      served_model_name=served_model_name, middlewares=list(middleware))
    elif NEW:
        launch_server(host, port, llm_args, tool_parser, metadata_server_config_file, role, disagg,
                      served_model_name=served_model_name)
    else:
        launch_server(host, port, llm_args, metadata_server_cfg=metadata_server_config_file, server_role=role,
                      disagg_cluster_config=disagg)
