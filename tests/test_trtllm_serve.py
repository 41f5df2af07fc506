"""TensorRT-LLM exactly as trtllm-serve: harmony-proxy runs trtllm-serve's own `serve` and serves the LLM it built.

On the fake trtllm-serve of tests/fake_trtllm (one surface per release: gpt-oss-dev, 1.0, 1.1, 1.2, 1.3.0rc19+,
1.4), for real command lines and YAMLs, the LLM harmony-proxy serves is built from exactly the arguments the
fake's own `serve` computed (or fails exactly where it fails), whatever they are.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER
from tests.test_trtllm import events, model_folder, on_surface, wait_loaded

DOCS = Path(__file__).resolve().parent.parent / "docs" / "trtllm"
RELEASES = ("gpt-oss-dev", "1.0", "1.1", "1.2", "1.3", "1.4")
# NVIDIA's H200 gpt-oss-120b config (examples/configs/database/openai/gpt-oss-120b/H200/8k1k_tp8_conc64.yaml, as
# the brief reads it: max_num_tokens 20000, max_seq_len 9236, TRITON MoE, env_overrides)
H200 = {"max_batch_size": 64, "max_num_tokens": 20000, "max_seq_len": 9236, "enable_attention_dp": False,
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": 64}, "moe_config": {"backend": "TRITON"},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": False}, "stream_interval": 20,
        "num_postprocess_workers": 4, "env_overrides": {"TRTLLM_ENABLE_PDL": "1"}}
EAGLE3 = {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3,
                                 "speculative_model_dir": "nvidia/gpt-oss-120b-Eagle3"},
          "cuda_graph_config": {"max_batch_size": 8, "enable_padding": True}}
CHUNKED = {"enable_chunked_prefill": True, "kv_cache_config": {"enable_block_reuse": True,
                                                               "event_buffer_max_size": 1024}}
COMMANDS: dict[str, tuple[list[str], Any]] = {  # flags after the model, and the YAML (a docs file or a dict)
    "seed low latency": (["--backend", "pytorch", "--tp_size", "1", "--ep_size", "1", "--trust_remote_code",
                          "--kv_cache_free_gpu_memory_fraction", "0.75"], "low_latency.yaml"),
    "seed max throughput": (["--tp_size", "8", "--ep_size", "8", "--max_batch_size", "640", "--max_num_tokens",
                             "16384", "--max_seq_len", "4096", "--trust_remote_code"], "max_throughput.yaml"),
    "seed hopper": (["--tp_size", "4", "--ep_size", "4"], "hopper_low_latency.yaml"),
    "seed 1.0": (["--tp_size", "1"], "1.0/low_latency.yaml"),
    "seed 1.3 hopper": (["--tp_size", "1"], "1.3/hopper_low_latency.yaml"),
    "NVIDIA H200": (["--tp_size", "8", "--ep_size", "8", "--max_batch_size", "64"], H200),
    "Eagle3": (["--max_batch_size", "8"], EAGLE3),
    "chunked prefill and KV events": (["--max_num_tokens", "4096"], CHUNKED),
    "flags against the YAML": (["--kv_cache_free_gpu_memory_fraction", "0.75", "--max_batch_size", "32"],
                               {"kv_cache_config": {"enable_block_reuse": False}, "max_batch_size": 64}),
    "copied 2026 command": (["--served_model_name", "gpt-oss", "--kv_cache_dtype", "fp8", "--no-telemetry",
                             "--hf_revision", "main"], None),
    "deprecated flags": (["--fail_fast_on_attention_window_too_large", "--cluster_size", "2"], None),
    "unmerged --set": (["--set", "kv_cache_config.enable_block_reuse=false"], None),
}


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from on_surface(request.param, monkeypatch)


def command_line(folder: Path, flags: list[str], extra: Any) -> list[str]:
    command = [str(folder), *flags]
    if isinstance(extra, str):
        command += ["--extra_llm_api_options", str(DOCS / extra)]
    elif extra is not None:
        (folder / "extra.yaml").write_text(yaml.safe_dump(extra))
        command += ["--extra_llm_api_options", str(folder / "extra.yaml")]
    return command


def what_trtllm_serve_builds(command: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """Run the fake's own `serve` (launch_server caught, as a test spy): ("built", the LLM arguments as the LLM
    records them), or ("failed", its error or the LLM's)."""
    import click
    from tensorrt_llm._surface import plain
    from tensorrt_llm.commands import serve as module
    from tensorrt_llm.llmapi import LLM

    computed: list[dict[str, Any]] = []
    with monkeypatch.context() as patch:
        patch.setattr(module, "launch_server", lambda host, port, llm_args, *args, **kwargs: computed.append(llm_args))
        try:
            module.serve.main(args=command, standalone_mode=False)
        except click.ClickException as exc:
            return "failed", exc.format_message()
        except ValueError as exc:  # its YAML checks (pydantic)
            return "failed", str(exc)
    llm_args = computed[0]
    if sys.modules["tensorrt_llm._surface"].SURFACE.release >= 3:
        llm_args.pop("build_config", None)  # 2026 launch_server pops it for PyTorch (id 59682888564)
    try:
        llm = LLM(**llm_args)
    except ValueError as exc:
        return "failed", str(exc)
    llm.shutdown()
    return "built", plain(llm_args)


def what_harmony_proxy_serves(command: list[str], vocab: Any) -> tuple[str, Any, Any]:
    from proxy.engines.trtllm.engine import TrtllmEngine
    from proxy.engines.trtllm.serve import TrtllmServeError

    engine = TrtllmEngine(command, vocab)
    try:
        asyncio.run(engine.start())
    except (TrtllmServeError, ValueError) as exc:
        return "failed", str(exc), engine
    return "built", None, engine


@pytest.mark.parametrize("case", COMMANDS)
def test_the_llm_served_is_built_from_exactly_what_trtllm_serve_computed(
    case: str, release: str, tmp_path: Path, vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, extra = COMMANDS[case]
    (tmp_path / "expected").mkdir()
    (tmp_path / "served").mkdir()
    expected_folder = model_folder(tmp_path / "expected", [ANSWER])
    served_folder = model_folder(tmp_path / "served", [ANSWER])
    outcome, expected = what_trtllm_serve_builds(command_line(expected_folder, flags, extra), monkeypatch)
    got, message, engine = what_harmony_proxy_serves(command_line(served_folder, flags, extra), vocab)
    assert got == outcome, (message, expected)
    if outcome == "failed":  # where trtllm-serve fails, with its own message
        assert expected.replace(str(expected_folder), "M") in message.replace(str(served_folder), "M")
        return
    init = events(served_folder, "init")[0]
    served = {key: str(value).replace(str(served_folder), "M") if isinstance(value, str) else value
              for key, value in init["args"].items()}
    wanted = {key: str(value).replace(str(expected_folder), "M") if isinstance(value, str) else value
              for key, value in expected.items()}
    if "extra_llm_api_options" in wanted:
        wanted["extra_llm_api_options"] = served["extra_llm_api_options"]
    assert served == wanted
    assert init["instance"] == id(engine._llm)  # the very LLM trtllm-serve's launch_server built is served
    asyncio.run(engine.close())


def init_args(tmp_path: Path, vocab: Any, flags: list[str], extra: Any = None) -> dict[str, Any]:
    folder = model_folder(tmp_path, [ANSWER])
    _, message, engine = what_harmony_proxy_serves(command_line(folder, flags, extra), vocab)
    assert message is None, message
    asyncio.run(engine.close())
    return events(folder, "init")[0]["args"]


def test_an_eagle3_yaml_starts_on_every_release(release: str, tmp_path: Path, vocab: Any) -> None:
    """1: 2026 has no DecodingBaseConfig.from_dict; trtllm-serve leaves the dict to the discriminated union."""
    speculative = init_args(tmp_path, vocab, [], EAGLE3)["speculative_config"]
    assert speculative["max_draft_len"] == 3 and speculative["speculative_model_dir"] == "nvidia/gpt-oss-120b-Eagle3"


def test_explicit_flags_beat_the_yaml_from_1_3_and_kv_cache_config_is_merged(
    release: str, tmp_path: Path, vocab: Any
) -> None:
    """2: PR #14812 (1.3.0rc19): explicit flags win, and a YAML kv_cache_config is merged into the flags' one."""
    flags = ["--kv_cache_free_gpu_memory_fraction", "0.75", "--max_batch_size", "32"]
    args = init_args(tmp_path, vocab, flags, {"kv_cache_config": {"enable_block_reuse": False}, "max_batch_size": 64})
    kv = args["kv_cache_config"]
    if release in ("1.3", "1.4"):
        assert (args["max_batch_size"], kv["free_gpu_memory_fraction"], kv["enable_block_reuse"]) == (32, 0.75, False)
    else:  # the YAML wins, and its kv_cache_config replaces the flags' (the class default fraction returns)
        assert args["max_batch_size"] == 64 and kv == {"enable_block_reuse": False}


def test_copied_2026_commands_start_and_deprecated_flags_are_handled_as_trtllm_serve_does(
    release: str, tmp_path: Path, vocab: Any
) -> None:
    """3: --served_model_name, --kv_cache_dtype, --no-telemetry on 1.3+; --fail_fast_... and --cluster_size."""
    from proxy.engines.trtllm.engine import TrtllmEngine
    from proxy.engines.trtllm.serve import TrtllmServeError

    folder = model_folder(tmp_path, [ANSWER])
    engine = TrtllmEngine([str(folder), "--served_model_name", "gpt-oss", "--kv_cache_dtype", "fp8",
                           "--no-telemetry"], vocab)
    if release not in ("1.3", "1.4"):
        with pytest.raises(TrtllmServeError, match="No such option '--served_model_name'") as refused:
            engine.prepare()
        assert refused.value.exit_code == 2  # click's usage error, as that release's trtllm-serve exits
        return
    assert engine.prepare().served_model_name == "gpt-oss"
    asyncio.run(engine.start())
    args = events(folder, "init")[0]["args"]
    assert args["kv_cache_config"]["dtype"] == "fp8" and args["telemetry_config"]["disabled"] is True
    asyncio.run(engine.close())
    (tmp_path / "deprecated").mkdir()
    if release == "1.4":  # the newest has no --fail_fast_on_attention_window_too_large: refused as it refuses it
        with pytest.raises(TrtllmServeError, match="No such option '--fail_fast_on_attention_window_too_large'"):
            TrtllmEngine([str(folder), "--fail_fast_on_attention_window_too_large"], vocab).prepare()
        deprecated = init_args(tmp_path / "deprecated", vocab, ["--cluster_size", "2"])
        assert "moe_cluster_parallel_size" not in deprecated
        return
    deprecated = init_args(tmp_path / "deprecated", vocab, ["--fail_fast_on_attention_window_too_large",
                                                            "--cluster_size", "2"])
    assert "moe_cluster_parallel_size" not in deprecated  # trtllm-serve ignores --cluster_size
    assert deprecated.get("fail_fast_on_attention_window_too_large") is None  # 2026: not an LLM argument


def test_no_scheduler_config_on_pytorch_from_2026(release: str, tmp_path: Path, vocab: Any) -> None:
    """5: 2026 trtllm-serve sends scheduler_config (and build_config) only to the TensorRT backend."""
    args = init_args(tmp_path, vocab, [])
    if release in ("1.3", "1.4"):
        assert "scheduler_config" not in args and "build_config" not in args
    else:
        assert args["scheduler_config"]["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"


@pytest.mark.parametrize(("field", "value", "accepted_on"), [
    ("enable_trtllm_sampler", True, {"gpt-oss-dev", "1.0"}),
    ("use_torch_sampler", True, set()),
    ("sampler_type", "TorchSampler", {"1.1", "1.2", "1.3"}),
    ("kv_cache_config", {"tokens_per_block": 64}, {"1.3", "1.4"}),
    ("kv_cache_config", {"event_buffer_max_size": 1024}, set(RELEASES)),
    ("moe_config", {"backend": "TRITON"}, {"1.1", "1.2", "1.3", "1.4"}),
    ("moe_config", {"backend": "WIDEEP"}, {"gpt-oss-dev", "1.0", "1.1", "1.2", "1.3"}),
    ("moe_config", {"backend": "AUTO"}, {"1.3", "1.4"}),
    ("env_overrides", {"TRTLLM_ENABLE_PDL": "1"}, {"1.3", "1.4"}),
    ("generation_config", "auto", {"1.3", "1.4"}),
    ("num_serve_frontends", 1, {"1.4"}),
    ("scheduler_config", {"dynamic_batch_config": {"enable_batch_size_tuning": True}}, {"1.3", "1.4"}),
])
def test_the_fake_is_as_strict_as_each_release(release: str, field: str, value: Any, accepted_on: set[str]) -> None:
    """6: the fake's classes take each release's fields and values, and refuse the others (extra="forbid")."""
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    try:
        TorchLlmArgs(model="m", **{field: value})
    except ValueError:
        assert release not in accepted_on
    else:
        assert release in accepted_on


@pytest.mark.parametrize("release", ["1.4"], indirect=True)
def test_disaggregated_roles_are_refused_with_the_reason(release: str, tmp_path: Path, vocab: Any) -> None:
    from proxy.engines.trtllm.engine import TrtllmEngine
    from proxy.engines.trtllm.serve import TrtllmServeError
    folder = model_folder(tmp_path, [ANSWER])
    with pytest.raises(TrtllmServeError, match="disaggregated"):
        TrtllmEngine([str(folder), "--server_role", "context", "--disagg_cluster_uri", "etcd://x"], vocab).prepare()
    assert "init" not in [e["event"] for e in events(folder)]  # nothing was built


@pytest.mark.parametrize("release", ["1.0", "1.4"], indirect=True)  # the oldest and newest release lines
@pytest.mark.parametrize(("flags", "prompt_limit"), [
    (["--max_num_tokens", "64"], 64),  # without chunked prefill: max_num_tokens
    (["--max_num_tokens", "64", "--max_seq_len", "256", "--enable_chunked_prefill"], 256),  # with it: max_seq_len
])
def test_models_the_codex_catalog_and_the_400_agree_with_the_engine(
    release: str, serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, flags: list[str], prompt_limit: int
) -> None:
    """4: the context advertised and enforced is what the built LLM takes, from its own resolved arguments."""
    from proxy.engines.trtllm.engine import TrtllmEngine

    server = serve(engine=TrtllmEngine([str(model_folder(tmp_path, [ANSWER])), *flags], vocab))
    wait_loaded(server)  # the LLM loads in a side thread
    models = httpx.get(server.base_url + "/v1/models", params={"client_version": "0.169.0"}, timeout=10).json()
    assert models["data"][0]["max_model_len"] == prompt_limit
    assert models["models"][0]["context_window"] == prompt_limit
    for length, status in ((prompt_limit - 8, 200), (prompt_limit + 1, 400)):  # 8 output tokens
        body = {"model": MODEL, "prompt": list(range(1, length + 1)), "max_tokens": 8}
        response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
        assert response.status_code == status, response.text
        if status == 400:
            assert response.json()["error"]["code"] == "context_length_exceeded"
            assert str(prompt_limit) in response.json()["error"]["message"]
