"""The TensorRT-LLM engine on each release NVIDIA's gpt-oss guides name, as trtllm-serve behaves there.

The fake (tests/fake_trtllm, `_surface.py`) mirrors gpt-oss-dev, 1.0, 1.1, 1.2 and 1.3 (2026 main); each test
runs on all five. TensorRT-LLM itself needs a GPU: these check the adapter against the real classes' rules, not
the kernels.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.engines.trtllm_args import TrtllmFlags, llm_arguments
from tests.conftest import LiveServer
from tests.test_e2e_chat import ANSWER, CALL
from tests.test_trtllm import ASK, FAKE, events, forget_tensorrt_llm, model_folder, trtllm_server

RELEASES = ("gpt-oss-dev", "1.0", "1.1", "1.2", "1.3")
MIXED_SAMPLER = {"gpt-oss-dev", "1.0"}  # enable_mixed_sampler exists, and without it every request is greedy
DOCS = Path(__file__).resolve().parent.parent / "docs" / "trtllm"


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("FAKE_TRTLLM_SURFACE", request.param)
    sys.path.insert(0, str(FAKE))
    forget_tensorrt_llm()
    yield request.param
    sys.path.remove(str(FAKE))
    forget_tensorrt_llm()


def last_generate(folder: Path) -> dict[str, Any]:
    return events(folder, "generate")[-1]


def test_requests_that_leave_sampling_unset_are_sampled_as_by_trtllm_serve(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="harmony_proxy")
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder)
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 200
    generate = last_generate(folder)
    assert generate["decoding"] == "sampling"  # temperature alone was greedy before 1.2, and everything on 1.0
    assert {k: generate["sampling"][k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "temperature": 0}, timeout=30)
    assert last_generate(folder)["decoding"] == "greedy"  # asked for
    init = events(folder, "init")[0]["args"]
    assert init.get("enable_mixed_sampler") is (True if release in MIXED_SAMPLER else None)
    assert ("decodes every request greedily without enable_mixed_sampler" in caplog.text) == (release in MIXED_SAMPLER)


def test_a_yaml_that_turns_the_mixed_sampler_off_is_said_to_decode_greedily(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    if release not in MIXED_SAMPLER:  # removed by PR #7294: the key stops the start, as with trtllm-serve
        from proxy.engines.trtllm import TrtllmEngine

        with pytest.raises(ValueError, match="invalid argument: enable_mixed_sampler"):
            TrtllmEngine({"model": str(folder), "enable_mixed_sampler": False}, vocab).load()
        return
    server = trtllm_server(serve, vocab, folder, enable_mixed_sampler=False)
    httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30)
    assert last_generate(folder)["decoding"] == "greedy"  # what the user's YAML chose, and said
    assert "EVERY request greedily" in caplog.text


def test_ignore_eos_generates_past_call_and_endoftext(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str
) -> None:
    script = CALL + "<|endoftext|>more"
    folder = model_folder(tmp_path, [script, ANSWER])
    server = trtllm_server(serve, vocab, folder)
    body = {"model": ASK["model"], "prompt": [1, 2, 3], "max_tokens": 500, "return_token_ids": True,
            "ignore_eos": True}
    choice = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["token_ids"] == vocab.encode_harmony(script)  # from 1.2, _setup's stops would end it at <|call|>
    assert choice["finish_reason"] == "length"
    plain = httpx.post(server.base_url + "/v1/completions", json={**body, "ignore_eos": False}, timeout=30).json()
    assert plain["choices"][0]["finish_reason"] == "stop"  # without ignore_eos the stops are as trtllm-serve's


def test_a_seed_is_applied_where_the_release_can_and_said_not_to_be_elsewhere(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    server = trtllm_server(serve, vocab, folder)
    httpx.post(server.base_url + "/v1/chat/completions", json={**ASK, "seed": 7}, timeout=30)
    applied = release == "1.3"
    assert last_generate(folder)["seed_used"] == (7 if applied else None)
    assert ("seed is not applied by TensorRT-LLM" in caplog.text) != applied


def test_cached_tokens_are_reported_from_1_2_and_said_missing_before(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = trtllm_server(serve, vocab, model_folder(tmp_path, [ANSWER]))
    for _ in range(2):
        usage = httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).json()["usage"]
    reported = release in ("1.2", "1.3")  # PR #7637 merged 2025-10-16: after 1.1 was cut
    assert ("prompt_tokens_details" in usage) == reported
    assert ("does not report cached prompt tokens" in caplog.text) != reported


def test_a_speculative_config_dict_is_converted_as_trtllm_serve_converts_it(
    serve: Callable[..., LiveServer], vocab: Any, tmp_path: Path, release: str
) -> None:
    folder = model_folder(tmp_path, [ANSWER])
    eagle = {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "nvidia/gpt-oss-120b-Eagle3"}
    server = trtllm_server(serve, vocab, folder, speculative_config=eagle)
    assert httpx.post(server.base_url + "/v1/chat/completions", json=ASK, timeout=30).status_code == 200
    assert events(folder, "init")[0]["args"]["speculative_config"].startswith("EagleDecodingConfig(max_draft_len=3")


def test_the_engine_imports_the_stable_path(vocab: Any, tmp_path: Path, release: str) -> None:
    from proxy.engines.trtllm import TrtllmEngine

    engine = TrtllmEngine({"model": str(model_folder(tmp_path, [ANSWER]))}, vocab)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine._import_tensorrt_llm()
    assert not [w for w in caught if "sampling_params" in str(w.message)]  # tensorrt_llm.sampling_params warns in 2026


@pytest.mark.parametrize("backend", ["TRITON", "AUTO", "CUTLASS"])
def test_moe_backends_per_release(vocab: Any, tmp_path: Path, release: str, backend: str,
                                  caplog: pytest.LogCaptureFixture) -> None:
    from proxy.engines.trtllm import TrtllmEngine

    engine = TrtllmEngine({"model": str(model_folder(tmp_path, [ANSWER])), "moe_config": {"backend": backend}}, vocab)
    if backend == "AUTO" and release != "1.3":
        with pytest.raises(ValueError, match="MoeConfig"):  # AUTO is 2026's
            engine.load()
        return
    engine.load()
    said = "TRITON is deprecated" in caplog.text and "backend AUTO" in caplog.text
    assert said == (backend == "TRITON" and release == "1.3")


# The docs/trtllm YAML files: where each loads (the plain ones load on 1.0 too, since the engine turns on the mixed
# sampler there; with trtllm-serve, 1.0 needs the 1.0/ files).
FOR_1_0 = ("gpt-oss-dev", "1.0")
YAMLS = {
    "low_latency.yaml": RELEASES,
    "max_throughput.yaml": RELEASES,
    "hopper_low_latency.yaml": RELEASES,  # TRITON: said deprecated on 1.3
    "1.0/low_latency.yaml": FOR_1_0,  # enable_mixed_sampler: removed in 1.1
    "1.0/max_throughput.yaml": FOR_1_0,
    "1.0/hopper_low_latency.yaml": FOR_1_0,
    "1.3/hopper_low_latency.yaml": ("1.3",),  # AUTO: 2026's
}


@pytest.mark.parametrize("name", sorted(YAMLS))
def test_each_docs_yaml_loads_on_the_releases_it_is_for(vocab: Any, tmp_path: Path, release: str, name: str) -> None:
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    from proxy.engines.trtllm import TrtllmEngine
    from proxy.engines.trtllm_args import LlmArgsError

    folder = model_folder(tmp_path, [ANSWER])
    flags = TrtllmFlags(str(folder), extra_llm_api_options=DOCS / name)
    known = set(TorchLlmArgs.model_fields.keys())
    if release not in YAMLS[name]:
        with pytest.raises((LlmArgsError, ValueError), match="enable_mixed_sampler|MoeConfig"):
            TrtllmEngine(llm_arguments(flags, known), vocab).load()
        return
    TrtllmEngine(llm_arguments(flags, known), vocab).load()
    init = events(folder, "init")[0]["args"]
    assert init.get("enable_mixed_sampler") is (True if release in FOR_1_0 else None)
    assert init["moe_config"] == yaml.safe_load((DOCS / name).read_text())["moe_config"]


def test_the_fake_is_as_strict_as_each_release(release: str) -> None:
    """What the real classes do per release, so that the tests above could fail."""
    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi import SamplingParams
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    fields = TorchLlmArgs.model_fields
    assert ("enable_mixed_sampler" in fields) == (release in MIXED_SAMPLER)  # removed by PR #7294
    assert ("custom_tokenizer" in fields) == (release == "1.3")
    alone = SamplingParams(temperature=1.0)
    assert alone.decoding(mixed_sampler=True) == ("sampling" if release in ("1.2", "1.3") else "greedy")
    served = SamplingParams(temperature=1.0, top_p=1.0, top_k=0)
    assert served.decoding(mixed_sampler=False) == ("greedy" if release in MIXED_SAMPLER else "sampling")
    served._setup(200002, [200002, 199999, 200012])
    assert served.stop_token_ids == ([199999, 200012] if release in ("1.2", "1.3") else None)
    with pytest.raises(ValueError, match="LLM got invalid argument"):
        LLM("nowhere", not_an_argument=1)
    if release != "1.3":
        with pytest.raises(ValueError, match="speculative_config"):
            LLM("nowhere", speculative_config={"decoding_type": "Eagle"})
