"""No test leaves a process behind, whatever fails: every process the session starts carries a mark in its
environment (inherited by its children, orphans too), and at the session's end any still running is named, killed
and fails the session. A leftover that is exiting gets a few seconds to finish first (a browser's crash handler)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

MARK = "HARMONY_PROXY_TEST_SESSION"


def marked(session: str) -> dict[int, str]:
    """The processes (pid: command line) whose environment carries this session's mark, this one left out."""
    found = {}
    needle = f"{MARK}={session}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z":  # exited, not yet reaped
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if _own_resource_tracker(entry, command):
                continue
            found[int(entry.name)] = command
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _own_resource_tracker(entry: Path, command: str) -> bool:
    """multiprocessing's resource tracker of this process: started by the first test that uses multiprocessing, it
    ends with this process (it reads a pipe this process holds), so it is no leftover."""
    parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
    return parent == os.getpid() and "multiprocessing.resource_tracker" in command


def leftovers(session: str, grace: float = 5.0) -> dict[int, str]:
    """The marked processes still running, given up to `grace` seconds to exit."""
    waited = 0.0
    while (found := marked(session)) and waited < grace:
        time.sleep(0.1)
        waited += 0.1
    return found


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # one mark for the whole run
        os.environ.setdefault(MARK, uuid.uuid4().hex)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    found = leftovers(os.environ[MARK])
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if found:
        lines = "\n".join(f"  {pid}: {command[:300]}" for pid, command in sorted(found.items()))
        session.config.stash[LEFT] = lines
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(LEFT, "")
    if lines:
        terminalreporter.write_sep("=", "processes the tests left running (killed now)", red=True)
        terminalreporter.write_line(lines)


LEFT = pytest.StashKey[str]()
