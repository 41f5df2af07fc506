"""The vocabulary loads with no network; the command line starts, reports and fails clearly."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from parsers.vocab import BUNDLED_VOCAB, VOCAB_FILE_NAME, VocabError, load_vocab

# Any download attempt goes to a dead proxy and the download cache is empty: loading must not need either.
OFFLINE = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIKTOKEN")}
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    return {**env, **OFFLINE, "TIKTOKEN_RS_CACHE_DIR": str(cache), "TMPDIR": str(tmp_path),
            "XDG_DATA_HOME": str(tmp_path / "data"), **extra}  # a real engine's default store: never the user's


def test_bundled_vocabulary_loads_offline_and_leaves_no_download(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    code = (
        "from parsers.vocab import load_vocab; v = load_vocab(); "
        "print(v.encode_harmony('<|start|>assistant'), v.stop_token_ids)"
    )
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[200006, 173781] (200002, 200012)"
    assert list((tmp_path / "cache").iterdir()) == []  # nothing was downloaded or cached
    assert "TIKTOKEN_ENCODINGS_BASE" not in os.environ


def test_a_user_vocabulary_folder_wins(tmp_path: Path) -> None:
    folder = tmp_path / "vocab"
    folder.mkdir()
    (folder / VOCAB_FILE_NAME).write_bytes(gzip.decompress(BUNDLED_VOCAB.read_bytes()))
    vocab = load_vocab({"TIKTOKEN_ENCODINGS_BASE": str(folder)})
    assert vocab.decode(vocab.encode("hello")) == "hello"


def test_a_wrong_user_vocabulary_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / VOCAB_FILE_NAME).write_bytes(b"not a vocabulary\n")
    with pytest.raises(VocabError, match="sha256"):
        load_vocab({"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)})
    with pytest.raises(VocabError, match="cannot be read"):
        load_vocab({"TIKTOKEN_ENCODINGS_BASE": str(tmp_path / "missing")})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_healthy(port: int, process: subprocess.Popen[str]) -> None:
    """Until /health answers 200, as long as the server runs (a start takes seconds, minutes on a busy machine;
    pytest-timeout bounds a hang). A server that stops, or is still starting when the wait fails, is killed."""
    try:
        while True:
            assert process.poll() is None, process.stdout.read() if process.stdout else "the server stopped"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise


def stop(process: subprocess.Popen[str]) -> str:
    process.terminate()
    output, _ = process.communicate(timeout=30)
    return output


@pytest.mark.parametrize("launcher", [["harmony-proxy"], [sys.executable, "-m", "proxy"]], ids=["script", "module"])
def test_serve_without_engine_says_loop_parser_and_mock_in_its_first_log_lines(
    tmp_path: Path, launcher: list[str],
) -> None:
    if launcher == ["harmony-proxy"]:
        launcher = [str(Path(sys.executable).with_name("harmony-proxy"))]
    port = free_port()
    process = start([*launcher, "serve", "--port", str(port)], clean_env(tmp_path))
    try:
        wait_healthy(port, process)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "openai/gpt-oss-20b", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        ).json()
        assert "mock" in answer["choices"][0]["message"]["content"]
    finally:
        output = stop(process)
    first, second = output.splitlines()[:2]
    # The default install is the fast one: uvloop and httptools come with it.
    assert "event loop uvloop, HTTP parser httptools, 1 worker process" in first
    assert "MOCK engine" in second and "TensorRT-LLM is not installed" in second
    # SIGTERM shuts down gracefully (uvicorn then re-raises the signal, so the status may say so).
    assert "Application shutdown complete" in output and process.returncode in (0, -15)


def test_the_mock_stores_responses_in_a_temporary_folder_it_removes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    process = start([sys.executable, "-m", "proxy", "serve", "--port", str(port)], clean_env(tmp_path, HOME=str(home)))
    try:
        wait_healthy(port, process)
        created = httpx.post(f"http://127.0.0.1:{port}/v1/responses",
                             json={"model": "openai/gpt-oss-20b", "input": "Use get_weather.", "tools": [{
                                 "type": "function", "name": "get_weather", "parameters": {"type": "object"}}]},
                             timeout=30).json()
        stored = httpx.get(f"http://127.0.0.1:{port}/v1/responses/{created['id']}", timeout=30)
        assert stored.status_code == 200  # stored, so previous_response_id works
        folders = [path for path in tmp_path.iterdir() if path.name.startswith("harmony-proxy-store-")]
        assert [path.name for path in folders[0].iterdir()][:1] == ["responses.sqlite3"]
    finally:
        output = stop(process)
    assert "storing responses in" in output and "until the server stops" in output
    assert list(home.iterdir()) == []  # nothing written to the home folder
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("harmony-proxy-store-")]
    # The mock's own answer counts right.
    assert created["output"][0]["content"][0]["text"].count("1 tool;") == 1


def test_a_port_in_use_stops_the_server_before_the_engine_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", str(port)],
                                check=False, env=clean_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Address already in use" in result.stderr
    assert "engine is ready" not in result.stderr and "Traceback" not in result.stderr


def test_serve_help_says_what_the_api_key_covers() -> None:
    result = subprocess.run([sys.executable, "-m", "proxy", "serve", "--help"], check=True, capture_output=True,
                            text=True, timeout=60)
    text = " ".join(result.stdout.split())
    assert "on every route but /live, /health, /ready and the playground page" in text and "/v1 routes" not in text


def test_serve_scripted_engine_from_a_file(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    lines = ["<|channel|>final<|message|>first<|return|>", "<|channel|>final<|message|>second<|return|>"]
    script.write_text("\n".join(json.dumps({"completion": line}) for line in lines) + "\n")
    port = free_port()
    process = start(
        [sys.executable, "-m", "proxy", "serve", "--engine", "scripted", "--script", str(script), "--port", str(port),
         "--served-model-name", "test-model", "--reasoning-field", "reasoning", "--token-delay-ms", "1"],
        clean_env(tmp_path),
    )
    try:
        wait_healthy(port, process)
        answers = [
            httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]},
                timeout=30,
            ).json()["choices"][0]["message"]["content"]
            for _ in range(3)
        ]
    finally:
        stop(process)
    assert answers == ["first", "second", "first"]  # in order, cycling back to the first line


@pytest.mark.parametrize(
    ("args", "script", "message"),
    [
        (["--engine", "scripted"], None, "needs --script"),
        (["--engine", "scripted", "--script", "{script}"], "not json\n", "not valid JSON"),
        (["--engine", "scripted", "--script", "{script}"], '{"text": "x"}\n', 'expected an object like {"completion"'),
        (["--engine", "scripted", "--script", "{script}"], "\n", "no completions"),
        (["--engine", "scripted", "--script", "/nonexistent/script.jsonl"], None, "cannot read script"),
    ],
)
def test_startup_errors_are_one_clear_line(tmp_path: Path, args: list[str], script: str | None, message: str) -> None:
    path = tmp_path / "script.jsonl"
    if script is not None:
        path.write_text(script)
    args = [arg.replace("{script}", str(path)) for arg in args]
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", *args, "--port", str(free_port())], env=clean_env(tmp_path),
        capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_wrong_vocabulary_stops_the_server_at_start_up(tmp_path: Path) -> None:
    (tmp_path / VOCAB_FILE_NAME).write_text("broken\n")
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", str(free_port())],
        env=clean_env(tmp_path, TIKTOKEN_ENCODINGS_BASE=str(tmp_path)), capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "is not the gpt-oss vocabulary" in result.stderr and "Traceback" not in result.stderr
