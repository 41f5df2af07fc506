"""The README's Python example, run as written (its URL pointed at a test server) under every reasoning field."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.config import REASONING_FIELDS
from tests.conftest import LiveServer

README = Path(__file__).resolve().parent.parent / "README.md"


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
