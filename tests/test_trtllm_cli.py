"""`harmony-proxy serve` typed as NVIDIA's trtllm-serve commands for gpt-oss, end to end on the fake trtllm-serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_e2e_chat import ANSWER, CALL, WEATHER
from tests.test_trtllm import FAKE, events, model_folder
from tests.test_vocab_and_cli import clean_env, free_port, stop, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "trtllm"
PROXY = str(Path(sys.executable).with_name("harmony-proxy"))


def fake_env(tmp_path: Path, surface: str = "newest") -> dict[str, str]:
    # this checkout's code first: the console script would otherwise import wherever the project is installed from
    return clean_env(tmp_path, PYTHONPATH=os.pathsep.join((str(ROOT), str(FAKE))), FAKE_TRTLLM_SURFACE=surface)


def init_args(folder: Path) -> dict[str, Any]:
    return next(e for e in events(folder) if e["event"] == "init")["args"]


def test_a_seed_command_is_served_as_trtllm_serve_built_it(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    port = free_port()
    command = [PROXY, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port), "--backend", "pytorch",
               "--tp_size", "1", "--ep_size", "1", "--trust_remote_code", "--kv_cache_free_gpu_memory_fraction",
               "0.75", "--extra_llm_api_options", str(DOCS / "low_latency.yaml")]
    process = subprocess.Popen(command, env=fake_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        wait_healthy(port, process)
        model = folder.name  # as trtllm-serve, a local model directory is served under its folder name
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                            json={"model": model, "messages": [{"role": "user", "content": "hi"}]}).json()
        assert answer["choices"][0]["message"]["content"] == "It is 18C."
    finally:
        output = stop(process)
    arguments = init_args(folder)
    assert arguments["kv_cache_config"]["free_gpu_memory_fraction"] == 0.75
    assert arguments["moe_config"]["backend"] == "TRTLLM" and arguments["trust_remote_code"] is True
    assert arguments["guided_decoding_backend"] == "llguidance"  # the docs YAML sets it
    assert "serving with the trtllm engine" in output.splitlines()[1]  # chosen without --engine: it is installed
    # A real engine stores in the data folder: the test's own (clean_env), never the user's.
    assert f"storing responses in {tmp_path / 'data' / 'harmony-proxy' / 'responses.sqlite3'}" in output
    assert "are enforced by TensorRT-LLM's llguidance backend" in output
    assert [e["event"] for e in events(folder)][-1] == "shutdown"  # SIGTERM shut the LLM down


@pytest.mark.parametrize(("surface", "flags", "code", "said"), [
    ("1.2", ["--served_model_name", "gpt-oss"], 2, "No such option '--served_model_name'"),  # a 2026 flag
    ("newest", ["--set", "kv_cache_config.dtype=fp8"], 2, "No such option '--set'"),  # PR #19555 was not merged
    ("newest", ["--tp_size", "two"], 2, "'two' is not a valid integer"),
])
def test_trtllm_serve_usage_errors_are_its_own(tmp_path: Path, surface: str, flags: list[str], code: int,
                                               said: str) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    result = subprocess.run([PROXY, "serve", str(folder), *flags, "--port", str(free_port())],
                            env=fake_env(tmp_path, surface), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == code and said in result.stderr and "Traceback" not in result.stderr
    assert not events(folder)  # nothing was built


@pytest.mark.parametrize("yaml_text", ["not_a_setting: 1\n", "kv_cache_config:\n  free_gpu_memory_fractoin: 0.5\n"])
def test_an_llm_that_refuses_its_arguments_stops_the_server(tmp_path: Path, yaml_text: str) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    config = tmp_path / "options.yaml"
    config.write_text(yaml_text)
    command = [PROXY, "serve", str(folder), "--port", str(free_port()), "--extra_llm_api_options", str(config)]
    result = subprocess.run(command, env=fake_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode in (1, 2)
    assert ("not_a_setting" in result.stderr) or ("free_gpu_memory_fractoin" in result.stderr)


def test_sigterm_during_a_long_load_exits_promptly(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER], load_seconds="600")  # the control: a load far longer than a stop
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--engine", "trtllm", str(folder),
                                "--port", str(port)], env=fake_env(tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        while True:  # as long as it runs
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except httpx.TransportError:
                assert process.poll() is None
                time.sleep(0.1)
        assert health.status_code == 503  # up and answering while the model loads
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait()
        assert time.monotonic() - started < 600  # stopped mid-load, not after the 600 s load finished
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.parametrize("flag", [["--tp_size", "8"], ["--guided-decoding-backend", "xgrammar"]])
def test_trtllm_arguments_with_another_engine_are_refused(tmp_path: Path, flag: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "proxy", "serve", "--engine", "mock", *flag, "--port",
                             str(free_port())], env=clean_env(tmp_path), capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr
    assert "only taken with --engine trtllm" in result.stderr


def test_a_model_without_tensorrt_llm_installed_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "proxy", "serve", "openai/gpt-oss-120b", "--port", str(free_port())],
                            env=clean_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "needs TensorRT-LLM, which is not installed" in result.stderr


def test_an_old_release_with_xgrammar_serves_constraints_unenforced_and_says_so(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [CALL])
    port = free_port()
    process = subprocess.Popen([PROXY, "serve", str(folder), "--port", str(port), "--guided_decoding_backend",
                                "xgrammar"], env=fake_env(tmp_path, "oldest"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(port, process)
        body = {"model": folder.name, "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
                "tool_choice": "required"}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30).json()
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    finally:
        output = stop(process)
    assert "TensorRT-LLM 1.0.0rc6 (fake) serving" in output
    assert "NOT enforced" in output and "legacy structures/triggers form" in output  # at start-up
    assert "a call to get_weather required; analysis free, NOT enforced" in output  # and for the request
    assert init_args(folder)["guided_decoding_backend"] == "xgrammar"
    assert [e["guided"] for e in events(folder, "generate")] == [None]


def test_a_copied_2026_command_serves_under_its_name_with_its_context(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    port = free_port()
    command = [PROXY, "serve", str(folder), "--port", str(port), "--served_model_name", "gpt-oss", "--kv_cache_dtype",
               "fp8", "--no-telemetry", "--max_num_tokens", "256", "--max_seq_len", "4096", "--log_level", "info"]
    process = subprocess.Popen(command, env=fake_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        wait_healthy(port, process)  # three processes start on a busy machine: as long as they run
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"][0]
        assert (models["id"], models["max_model_len"]) == ("gpt-oss", 256)  # the longest prompt the LLM takes
        long_prompt = {"model": "gpt-oss", "messages": [{"role": "user", "content": "word " * 300}]}
        refused = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=long_prompt, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    finally:
        stop(process)
    assert init_args(folder)["kv_cache_config"]["dtype"] == "fp8"


def test_workers_serve_a_model_directory_by_its_name_and_list_where_its_events_are_published(tmp_path: Path) -> None:
    """`harmony-proxy serve /models/gpt-oss-fake --workers 2` with the LLM's KV-cache events on: every front end
    answers to the folder's name, as trtllm-serve does, and lists the engine process's publisher."""
    folder = model_folder(tmp_path, [ANSWER])
    options = tmp_path / "events.yaml"
    options.write_text("kv_cache_config: {enable_block_reuse: true, event_buffer_max_size: 1024}\n")
    port = free_port()
    process = subprocess.Popen([PROXY, "serve", str(folder), "--port", str(port), "--workers", "2",
                                "--extra_llm_api_options", str(options)], env=fake_env(tmp_path),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(port, process)  # three processes start on a busy machine: as long as they run
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
        assert [model["id"] for model in models] == ["gpt-oss-fake"]
        for _ in range(4):  # whichever front end answers
            sources = httpx.get(f"http://127.0.0.1:{port}/kv_event_sources", timeout=10)
            assert sources.status_code == 200 and sources.json()["0"]["endpoint"].startswith("tcp://*:")
    finally:
        output = stop(process)
    assert "publishing KV-cache events of rank 0" in output
