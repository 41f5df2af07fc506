"""Names of another project's module replaced for the length of a call, then put back.

harmony-proxy runs trtllm-serve's and `vllm serve`'s own start-up code and swaps only the piece that would start
their HTTP servers (proxy/engines/trtllm/serve.py, proxy/engines/vllm/serve.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def replaced(module: Any, names: dict[str, Any]) -> Iterator[None]:
    """`module`'s attributes `names` set to the given values inside the block, and back to their own after it."""
    saved = {name: getattr(module, name) for name in names}
    try:
        for name, value in names.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
