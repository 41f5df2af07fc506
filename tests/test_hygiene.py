"""The suite cleans up after itself: a process a test leaves running fails the session and is killed
(tests/processes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.processes import MARK

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
