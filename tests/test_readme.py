"""The README as a newcomer runs it, in order in fresh shells; its Python example under every reasoning field."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from proxy.config import REASONING_FIELDS
from tests.conftest import LiveServer
from tests.test_docs import SHELL, Ports, blocks, commands, listening_port, serve_arguments
from tests.test_vocab_and_cli import stop, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def python_example() -> str:
    """The first Python block, under "Set up and serve"."""
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)[0]


@pytest.mark.parametrize("field", REASONING_FIELDS)
def test_the_python_example_prints_answer_and_reasoning(serve: Callable[..., LiveServer], field: str) -> None:
    server = serve(reasoning_field=field)  # the mock engine, as `harmony-proxy serve` runs it without a model
    code = python_example().replace("http://127.0.0.1:8000", server.base_url)
    assert server.base_url in code
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer, reasoning = done.stdout.strip().split(" | reasoning: ")
    assert answer.startswith("[mock]") and reasoning.startswith("Mock engine, not a model.")


def newcomer(home: Path) -> dict[str, str]:
    """A fresh shell's environment: its own HOME, no virtualenv active (this one's bin folder off the PATH), this
    clone's code first (as `pip install .` of it would be)."""
    venv_bin = (Path(sys.prefix) / "bin").resolve()
    path = [entry for entry in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if entry and Path(entry).resolve() != venv_bin]
    return {"HOME": str(home), "PATH": os.pathsep.join(path), "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT),
            "TMPDIR": str(home), "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def test_a_newcomer_runs_the_readme_in_order(tmp_path: Path) -> None:
    """The README top to bottom as a newcomer pastes it, each block in a new terminal that starts as the README says
    (`. .venv/bin/activate`): the Try-it server, the curl and Python examples against it, then the laptop upstream
    recipe beside it. The README's ports are mapped to free ones, one for one, so commands that would collide on
    the README's ports collide here too."""
    page = blocks(README)
    try_it = page[0]
    assert try_it.language == "sh" and try_it.not_run and "tests/test_readme.py" in try_it.not_run
    create, activate, install, serve = try_it.code.strip().split(" && ")
    assert (create, install) == ("python3.11 -m venv .venv", "pip install .")  # this suite's own virtualenv, here
    assert f"in each new terminal run `{activate}` first" in " ".join(README.read_text(encoding="utf-8").split())
    clone, home = tmp_path / "clone", tmp_path / "home"
    clone.mkdir()
    home.mkdir()
    (clone / ".venv").symlink_to(sys.prefix)
    env, ports = newcomer(home), Ports()
    terminals: list[subprocess.Popen[str]] = []
    serving: dict[int, str] = {}  # port: the command serving on it

    def in_terminal(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", f"{activate} && {command}"], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=120, check=False)

    def new_terminal_serving(command: str) -> None:
        arguments = serve_arguments(command)
        assert arguments is not None
        if listening_port(arguments) is None:  # the default port, as the README's reader gets it
            command += f" --port {ports.port(8000)}"
        port = listening_port(shlex.split(command)) or 0
        assert port not in serving, f"`{command}`: its port is taken by `{serving.get(port)}`, still running"
        serving[port] = command
        log = (tmp_path / f"terminal-{len(terminals)}.log").open("w")
        terminals.append(subprocess.Popen(["bash", "-c", f"{activate} && exec {command}"], cwd=clone, env=env,
                                          stdout=log, stderr=subprocess.STDOUT, text=True))
        wait_healthy(port, terminals[-1])

    ran = []
    try:
        new_terminal_serving(ports.command(serve))
        ran.append(serve)
        for block in page[1:]:
            if block.not_run:
                continue
            if block.language == "python":
                done = in_terminal(f"python -c {shlex.quote(ports.command(block.code))}")
                assert done.returncode == 0, f"{block}: {done.stderr[-2000:]}"
                ran.append("python")
            elif block.language in SHELL:
                for command in commands(block.code):
                    command = ports.command(command)
                    if serve_arguments(command) is not None:
                        new_terminal_serving(command)
                    else:
                        assert command.startswith("curl "), f"{block}: `{command}`: no rule for it here"
                        done = in_terminal(command)
                        assert done.returncode == 0, f"{block}: {done.stderr}"
                        assert "error" not in json.loads(done.stdout), f"{block}: {done.stdout}"
                    ran.append(command.split()[0] + " " + command.split()[1])
        try_it_port = ports.port(8000)
        assert httpx.get(f"http://127.0.0.1:{try_it_port}/health", timeout=30).status_code == 200  # still serving
    finally:
        for terminal in terminals:
            stop(terminal)
    # Try-it and its curl, the upstream recipe (two servers and a curl) beside Try-it's server, the Python example
    assert ran == [serve, "curl -s", "harmony-proxy serve", "harmony-proxy serve", "curl -s", "python"], ran
    logs = [(tmp_path / f"terminal-{index}.log").read_text() for index in range(len(terminals))]
    assert not any("command not found" in log or "Address already in use" in log for log in logs)
