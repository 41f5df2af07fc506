"""The suite cleans up after itself: a process a test leaves running fails the session and is killed
(tests/processes.py), and no tool a test runs writes outside the session's temporary folder (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import SESSION_FOLDERS
from tests.node_tools import node_env
from tests.processes import MARK
from tests.vllm_server import vllm_python

ROOT = Path(__file__).resolve().parent.parent

LEAKY = """
import subprocess, sys

def test_starts_a_server_and_forgets_it():
    subprocess.Popen([sys.executable, "-c", "import time; print('leaked', flush=True); time.sleep(600)"])
"""


def test_a_process_left_running_fails_the_session_and_is_killed(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    env = {key: value for key, value in os.environ.items() if key != MARK}  # a session of its own
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.processes", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_leaky.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout
    assert "1 passed" in done.stdout  # the test itself passed: the session failed for what it left
    assert "processes the tests left running (killed now)" in done.stdout
    assert "time.sleep(600)" in done.stdout
    leaked = [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                                              check=True).stdout.splitlines() if "time.sleep(600)" in line
              and "print('leaked'" in line]
    assert leaked == []


def test_each_tool_keeps_its_caches_in_the_sessions_folder(folders_of_the_session: Path) -> None:
    """Where each tool the tests run would write, asked of the tool itself: under the session's folder."""
    root = folders_of_the_session
    for name in SESSION_FOLDERS:
        assert Path(os.environ[name]).is_relative_to(root), name
    npm = subprocess.run(["npm", "config", "get", "cache"], env=node_env(), capture_output=True, text=True,
                         timeout=120, check=True)
    assert Path(npm.stdout.strip()).is_relative_to(root)  # npm's cache, and its _logs in it
    pip = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, timeout=120,
                         check=True)
    assert Path(pip.stdout.strip()).is_relative_to(root)
    vllm = subprocess.run([str(vllm_python()), "-c", "import vllm.envs as e; print(e.VLLM_CACHE_ROOT)"],
                          capture_output=True, text=True, timeout=300, check=True)
    assert Path(vllm.stdout.strip().splitlines()[-1]).is_relative_to(root)


def test_a_session_writes_nothing_in_a_fresh_home(tmp_path: Path) -> None:
    """A session of the tests that drive Chromium and npm, run with a fresh, empty HOME: afterwards `find` finds
    nothing in it (Chromium's crash reports and dconf, npm's cache and logs all went to the session's folder)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key != MARK and not key.startswith("XDG_") and key not in SESSION_FOLDERS}
    env["HOME"] = str(home)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "base"),
                           "tests/test_playground.py::test_shows_errors_plainly",
                           "tests/test_hygiene.py::test_each_tool_keeps_its_caches_in_the_sessions_folder"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout
    found = subprocess.run(["find", str(home), "-mindepth", "1"], capture_output=True, text=True, check=True).stdout
    assert found == ""
