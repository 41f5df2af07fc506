"""Text as openai-harmony's Rust writes it: `str::lines` and serde_json's JSON.

The tool declarations (tools/typescript.py, tools/typescript_types.py, tools/freeform.py) must match the
library's text character for character, so the few places where Python's own functions differ are written here.
"""

from __future__ import annotations

import json
import math
from typing import Any

_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1


def rust_lines(text: str) -> list[str]:
    """Rust's `str::lines`: split at "\\n", drop one "\\r" before it, no empty last line."""
    *ended, last = text.split("\n")
    lines = [line.removesuffix("\r") for line in ended]
    return [*lines, last] if last else lines


def json_text(value: Any) -> str:
    """`value` as serde_json writes it: compact, non-ASCII kept, floats in ryu's shortest form."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value) if _I64_MIN <= value <= _U64_MAX else _float_text(float(value))
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json_text(str(key))}:{json_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(json_text, value)) + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _float_text(value: float) -> str:
    """ryu's `format_finite`: the same shortest digits as Python's repr, laid out its own way."""
    if not math.isfinite(value):
        return "null"  # what serde_json writes for them
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    stripped = digits.rstrip("0")
    k = int(exponent or 0) - len(fraction) + len(digits) - len(stripped)  # value = stripped * 10**k
    digits, length = stripped, len(stripped)
    kk = length + k  # 10**(kk-1) <= value < 10**kk
    if 0 <= k and kk <= 16:
        return f"{sign}{digits}{'0' * k}.0"
    if 0 < kk <= 16:
        return f"{sign}{digits[:kk]}.{digits[kk:]}"
    if -5 < kk <= 0:
        return f"{sign}0.{'0' * -kk}{digits}"
    if length == 1:
        return f"{sign}{digits}e{kk - 1}"
    return f"{sign}{digits[0]}.{digits[1:]}e{kk - 1}"
