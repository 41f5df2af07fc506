"""`harmony-proxy serve` typed as NVIDIA's trtllm-serve commands for gpt-oss, on the fake TensorRT-LLM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.engines.trtllm_args import LlmArgsError, TrtllmFlags, llm_arguments
from tests.test_e2e_chat import ANSWER, CALL, WEATHER
from tests.test_trtllm import FAKE, events, model_folder
from tests.test_vocab_and_cli import clean_env, free_port, stop, wait_healthy

DOCS = Path(__file__).resolve().parent.parent / "docs" / "trtllm"
PROXY = str(Path(sys.executable).with_name("harmony-proxy"))


def fake_env(tmp_path: Path, surface: str = "newest") -> dict[str, str]:
    return clean_env(tmp_path, PYTHONPATH=str(FAKE), FAKE_TRTLLM_SURFACE=surface)


def init_args(folder: Path) -> dict[str, Any]:
    return next(e for e in events(folder) if e["event"] == "init")["args"]


@pytest.mark.parametrize(
    ("yaml_file", "flags", "expected"),
    [
        # 1 GPU, low latency, with the seeds' underscore flags
        ("low_latency.yaml",
         ["--backend", "pytorch", "--tp_size", "1", "--ep_size", "1", "--trust_remote_code",
          "--kv_cache_free_gpu_memory_fraction", "0.75"],
         {"tensor_parallel_size": 1, "moe_expert_parallel_size": 1, "trust_remote_code": True,
          "kv_cache_config": {"free_gpu_memory_fraction": 0.75}, "enable_attention_dp": False,
          "cuda_graph_config": {"max_batch_size": 8, "enable_padding": True}, "moe_config": {"backend": "TRTLLM"}}),
        # 8 GPUs, max throughput, dashed spellings
        ("max_throughput.yaml",
         ["--backend", "pytorch", "--tp-size", "8", "--ep-size", "8", "--max-batch-size", "640", "--trust-remote-code",
          "--kv-cache-free-gpu-memory-fraction", "0.9", "--max-num-tokens", "16384", "--max-seq-len", "4096"],
         {"tensor_parallel_size": 8, "moe_expert_parallel_size": 8, "max_batch_size": 640, "max_num_tokens": 16384,
          "max_seq_len": 4096, "kv_cache_config": {"free_gpu_memory_fraction": 0.9}, "enable_attention_dp": True,
          "stream_interval": 10, "moe_config": {"backend": "CUTLASS"}}),
        # 4 GPUs on Hopper: the Triton MoE backend
        ("hopper_low_latency.yaml", ["--tp_size", "4", "--ep_size", "4"],
         {"tensor_parallel_size": 4, "moe_expert_parallel_size": 4, "moe_config": {"backend": "TRITON"}}),
    ],
)
def test_seed_commands_pass_flags_and_yaml_to_the_llm(
    tmp_path: Path, yaml_file: str, flags: list[str], expected: dict[str, Any]
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    port = free_port()
    command = [PROXY, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port), *flags,
               "--extra_llm_api_options", str(DOCS / yaml_file)]
    process = subprocess.Popen(command, env=fake_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        wait_healthy(port, process)
        model = str(folder)  # as trtllm-serve, the served model name defaults to the model
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                            json={"model": model, "messages": [{"role": "user", "content": "hi"}]}).json()
        assert answer["choices"][0]["message"]["content"] == "It is 18C."
    finally:
        output = stop(process)
    arguments = init_args(folder)
    assert {key: arguments[key] for key in expected} == expected
    assert arguments["model"] == str(folder) and arguments["backend"] == "pytorch"
    assert arguments["guided_decoding_backend"] == "llguidance"  # chosen when neither flag nor YAML names one
    assert "serving with the trtllm engine" in output.splitlines()[1]  # chosen without --engine: it is installed
    # A real engine stores in the data folder: the test's own (clean_env), never the user's.
    assert f"storing responses in {tmp_path / 'data' / 'harmony-proxy' / 'responses.sqlite3'}" in output
    assert "are enforced by TensorRT-LLM's llguidance backend" in output
    assert [e["event"] for e in events(folder)][-1] == "shutdown"  # SIGTERM shut the LLM down


def test_unknown_yaml_keys_stop_the_server_and_are_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    config = tmp_path / "options.yaml"
    config.write_text("enable_mixed_sampler: true\nstream_interval: 2\nnot_a_setting: 1\n")
    result = subprocess.run([PROXY, "serve", str(folder), "--extra_llm_api_options", str(config)],
                            env=fake_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "enable_mixed_sampler, not_a_setting" in result.stderr and "Traceback" not in result.stderr
    assert not events(folder)  # the LLM was never built


def test_an_llm_that_fails_to_build_stops_the_server(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    config = tmp_path / "options.yaml"
    config.write_text("kv_cache_config:\n  free_gpu_memory_fractoin: 0.5\n")  # a typo in a nested key
    command = [PROXY, "serve", str(folder), "--port", str(free_port()), "--extra_llm_api_options", str(config)]
    result = subprocess.run(command, env=fake_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "failed to start" in result.stderr and "free_gpu_memory_fractoin" in result.stderr


def test_sigterm_during_a_long_load_exits_promptly(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER], load_seconds="60")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--engine", "trtllm", "--model", str(folder),
                                "--port", str(port)], env=fake_env(tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        assert health.status_code == 503  # up and answering while the model loads
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        assert time.monotonic() - started < 15
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.parametrize("flag", [["--tp_size", "8"], ["--guided-decoding-backend", "xgrammar"]])
def test_trtllm_flags_with_another_engine_are_refused(tmp_path: Path, flag: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "proxy", "serve", "--engine", "mock", *flag],
                            env=clean_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    name = flag[0].lstrip("-").replace("-", "_")
    assert result.returncode == 2 and f"--{name} is only used with --engine trtllm" in result.stderr


def test_a_model_without_tensorrt_llm_installed_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "proxy", "serve", "openai/gpt-oss-120b"],
                            env=clean_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "needs TensorRT-LLM, which is not installed" in result.stderr


@pytest.mark.parametrize(
    ("flag", "yaml_text", "expected"),
    [
        (None, "", "llguidance"),  # auto: llguidance takes our grammar in every release
        ("auto", "guided_decoding_backend: xgrammar\n", "xgrammar"),  # the YAML's choice is kept
        ("llguidance", "guided_decoding_backend: xgrammar\n", "llguidance"),  # the flag wins, as other flags
        ("none", "guided_decoding_backend: xgrammar\n", None),  # constraints only described in the prompt
        (None, "speculative_config:\n  decoding_type: Eagle\n", None),  # 1.0 refuses the two together
        ("xgrammar", "speculative_config:\n  decoding_type: Eagle\n", "xgrammar"),  # asked for: TensorRT-LLM decides
    ],
)
def test_the_guided_decoding_backend_from_the_flag_and_the_yaml(
    tmp_path: Path, flag: str | None, yaml_text: str, expected: str | None
) -> None:
    config = tmp_path / "options.yaml"
    config.write_text(yaml_text)
    arguments = llm_arguments(TrtllmFlags("m", extra_llm_api_options=config, guided_decoding_backend=flag), None)
    assert arguments.get("guided_decoding_backend") == expected
    with pytest.raises(LlmArgsError, match="--guided-decoding-backend must be one of"):
        llm_arguments(TrtllmFlags("m", guided_decoding_backend="outlines"), None)


def test_an_old_release_with_xgrammar_serves_constraints_unenforced_and_says_so(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [CALL])
    port = free_port()
    process = subprocess.Popen([PROXY, "serve", str(folder), "--port", str(port), "--guided_decoding_backend",
                                "xgrammar"], env=fake_env(tmp_path, "oldest"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(port, process)
        body = {"model": str(folder), "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
                "tool_choice": "required"}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30).json()
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    finally:
        output = stop(process)
    assert "with TensorRT-LLM 1.0.0rc6 (fake)" in output
    assert "NOT enforced" in output and "legacy structures/triggers form" in output  # at start-up
    assert "a call to get_weather required; analysis free, NOT enforced" in output  # and for the request
    assert init_args(folder)["guided_decoding_backend"] == "xgrammar"
    assert [e["guided"] for e in events(folder, "generate")] == [None]


TRTLLM_SERVE_SCHEDULER = {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT", "dynamic_batch_config": {
    "enable_batch_size_tuning": True, "enable_max_num_tokens_tuning": False,
    "dynamic_batch_moving_average_window": 128}}


def test_every_trtllm_serve_flag_is_mapped_or_noticed_and_the_yaml_wins_as_in_trtllm_serve(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    config = tmp_path / "options.yaml"
    config.write_text("max_batch_size: 8\nkv_cache_config:\n  enable_block_reuse: false\n")
    port = free_port()
    long_prompt = {"model": str(folder), "messages": [{"role": "user", "content": "word " * 300}]}
    command = [PROXY, "serve", str(folder), "--port", str(port), "--tensor_parallel_size", "2", "--pp_size", "1",
               "--cp-size", "1", "--moe_expert_parallel_size", "2", "--cluster_size", "1", "--gpus_per_node", "8",
               "--max_beam_width", "1", "--max_batch_size", "64", "--max_num_tokens", "256", "--max_seq_len", "4096",
               "--free_gpu_memory_fraction", "0.8", "--hf_revision", "main", "--enable_attention_dp",
               "--fail_fast_on_attention_window_too_large", "--custom_tokenizer", "o200k", "--otlp_traces_endpoint",
               "http://127.0.0.1:4318", "--num_postprocess_workers", "2", "--reasoning_parser", "deepseek-r1",
               "--tool_parser", "qwen3", "--chat_template", "x.jinja", "--media_io_kwargs", "{}",
               "--num_serve_frontends", "1", "--config", str(config), "--set", "kv_cache_config.dtype=fp8",
               "--log_level", "info"]
    process = subprocess.Popen(command, env=fake_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        wait_healthy(port, process)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        refused = httpx.post(url, json=long_prompt, timeout=30)  # longer than max_num_tokens, chunked prefill off
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    finally:
        output = stop(process)
    arguments = init_args(folder)
    assert {key: arguments[key] for key in (
        "tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size", "moe_expert_parallel_size",
        "moe_cluster_parallel_size", "gpus_per_node", "max_beam_width", "max_num_tokens", "max_seq_len", "revision",
        "enable_attention_dp", "fail_fast_on_attention_window_too_large", "custom_tokenizer", "otlp_traces_endpoint",
    )} == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "context_parallel_size": 1,
           "moe_expert_parallel_size": 2, "moe_cluster_parallel_size": 1, "gpus_per_node": 8, "max_beam_width": 1,
           "max_num_tokens": 256, "max_seq_len": 4096, "revision": "main", "enable_attention_dp": True,
           "fail_fast_on_attention_window_too_large": True, "custom_tokenizer": "o200k",
           "otlp_traces_endpoint": "http://127.0.0.1:4318"}
    # the YAML replaces what the flags built, kv_cache_config whole (the flag's 0.8 is gone), then --set
    assert arguments["max_batch_size"] == 8
    assert arguments["kv_cache_config"] == {"enable_block_reuse": False, "dtype": "fp8"}
    assert "overrides the command line's kv_cache_config, max_batch_size" in output
    assert arguments["scheduler_config"] == TRTLLM_SERVE_SCHEDULER
    for flag in ("num_postprocess_workers", "reasoning_parser", "tool_parser", "chat_template", "media_io_kwargs"):
        assert f"--{flag} " in output and "accepted and ignored" in output
    assert "context 4096 tokens" in output and "prompts up to 256 tokens (chunked prefill off" in output
    assert "admitting 8 requests at once" in output  # the batch the YAML set
    assert "trtllm-serve leaves it unset" in output and "--guided-decoding-backend none" in output


def test_chunked_prefill_takes_prompts_longer_than_max_num_tokens(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    port = free_port()
    process = subprocess.Popen([PROXY, "serve", str(folder), "--port", str(port), "--max_num_tokens", "64",
                                "--enable_chunked_prefill"], env=fake_env(tmp_path, "1.1"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(port, process)
        body = {"model": str(folder), "messages": [{"role": "user", "content": "word " * 300}]}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200
    finally:
        output = stop(process)
    assert init_args(folder)["enable_chunked_prefill"] is True
    assert "context 131072 tokens" in output and "prompts up to 131072 tokens (chunked prefill on)" in output


@pytest.mark.parametrize(("flags", "reason"), [
    (["--server_role", "CONTEXT"], "disaggregated serving"),
    (["--custom_module_dirs", "."], "custom model modules"),
    (["--backend", "pytorch", "--custom_tokenizer", "o200k"], "no LLM argument custom_tokenizer"),
])
def test_trtllm_serve_flags_that_cannot_work_here_are_refused_with_the_reason(
    tmp_path: Path, flags: list[str], reason: str
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    result = subprocess.run([PROXY, "serve", str(folder), *flags], env=fake_env(tmp_path, "1.2"), capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2 and reason in result.stderr and "Traceback" not in result.stderr
    assert not events(folder)
