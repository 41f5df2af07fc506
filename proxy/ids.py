"""Ids in OpenAI's spelling: a prefix and random hex."""

from __future__ import annotations

import uuid


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + uuid.uuid4().hex[:length]
