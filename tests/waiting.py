"""Waiting in tests without wall-clock bounds: wait for a condition as long as it takes (pytest-timeout catches a
hang), and measure cost in CPU time, which a busy machine does not inflate as it does elapsed time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

TICK = 1 / os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time (10 ms)


def eventually(condition: Callable[[], object], still: Callable[[], object] = lambda: True,
               interval: float = 0.01) -> None:
    """Return once `condition()` is true; fail as soon as `still()` (what must hold meanwhile: a process runs, a
    control stream is still streaming) is false."""
    while not condition():
        assert still(), "the control ended before the condition held"
        time.sleep(interval)


def process_cpu(pid: int, thread: int | None = None) -> float:
    """CPU seconds (user and system) a process has used, all its threads; of one thread with `thread` (its id)."""
    path = Path(f"/proc/{pid}/stat") if thread is None else Path(f"/proc/{pid}/task/{thread}/stat")
    fields = path.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * TICK
