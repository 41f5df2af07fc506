"""Ids in OpenAI's spelling (a prefix and random hex), and the one check of every id a client sends.

A client names responses, conversations and items by id in paths, queries and bodies, and chooses the ids of its
own input items. Each is checked where it enters (`checked_id`), so that every store answers the same: an id may
not hold a control character (PostgreSQL's text cannot hold a NUL, and none belongs in an id) and is at most
MAX_ID_LENGTH characters (a PostgreSQL index entry is at most ~2.7 kB). Lone surrogates never get this far: a body
that holds one is refused when it is read (`proxy/validation.py`), and a path's bytes that are not UTF-8 decode as
U+FFFD.
"""

from __future__ import annotations

import re
import uuid

from proxy.errors import invalid_request

MAX_ID_LENGTH = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + uuid.uuid4().hex[:length]


def id_problem(value: str) -> str | None:
    """Why `value` cannot be an id, or None if it can."""
    if len(value) > MAX_ID_LENGTH:
        return f"an id is at most {MAX_ID_LENGTH} characters (this one has {len(value)})"
    if _CONTROL.search(value):
        return "an id may not hold control characters"
    return None


def checked_id(value: str, param: str) -> str:
    """`value`, an id a client sent as `param`; a 400 naming `param` if it cannot be one."""
    problem = id_problem(value)
    if problem is not None:
        raise invalid_request(f"Invalid '{param}': {problem}.", param=param, code="invalid_value")
    return value
