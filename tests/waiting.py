"""Waiting in tests without wall-clock bounds: wait for a condition as long as it takes (pytest-timeout catches a
hang), and measure cost in CPU time, which a busy machine does not inflate as it does elapsed time."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

TICK = 1 / os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time (10 ms)
ENDED = "the control ended before the condition held"
T = TypeVar("T")


def eventually(condition: Callable[[], T], still: Callable[[], object] = lambda: True, interval: float = 0.01,
               why: str | Callable[[], str] = ENDED) -> T:
    """Return `condition()`'s value once it is true; fail as soon as `still()` (what must hold meanwhile: a process
    runs, a control stream is still streaming) is false, saying `why` (a function is called only then: a log's
    tail, read once the process has ended)."""
    while not (value := condition()):
        assert still(), why() if callable(why) else why
        time.sleep(interval)
    return value


async def eventually_async(condition: Callable[[], T], still: Callable[[], object] = lambda: True,
                           interval: float = 0.01, why: str | Callable[[], str] = ENDED) -> T:
    """`eventually` in a coroutine: the event loop runs while it waits (what it waits for may be done on it)."""
    while not (value := condition()):
        assert still(), why() if callable(why) else why
        await asyncio.sleep(interval)
    return value


def process_cpu(pid: int, thread: int | None = None) -> float:
    """CPU seconds (user and system) a process has used, all its threads; of one thread with `thread` (its id)."""
    path = Path(f"/proc/{pid}/stat") if thread is None else Path(f"/proc/{pid}/task/{thread}/stat")
    fields = path.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * TICK
