"""Runs of 1,024 or more characters without a break, or of nothing but whitespace: never natural text (base64,
DNA, a key held down). openai-harmony's BPE is quadratic in the length of one pre-token ("x" * 40_000 takes half
a second, holding the GIL), so the vocabulary encodes such runs in chunks (`parsers/vocab.py`), and tool
declarations, which openai-harmony's own renders write whole, may not hold one (`tools/definitions.py`)."""

from __future__ import annotations

import re

LONG_RUN = re.compile(r"\S{1024,}|\s{1024,}")


def has_long_run(text: str) -> bool:
    """Whether text holds a run that `Vocab.encode` would have to cut (openai-harmony's own renders cannot)."""
    return len(text) >= 1024 and LONG_RUN.search(text) is not None
