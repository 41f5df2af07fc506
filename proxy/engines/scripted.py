"""The scripted engine: each request plays back the next completion of a JSON Lines file.

One object per line, `{"completion": "<Harmony text the model writes after <|start|>assistant>"}`; requests
take the lines in order and start again from the first after the last. This is how tests, and people testing
their agent loops, script the model.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from parsers.vocab import Vocab
from proxy.engines.base import GenerationRequest
from proxy.engines.playback import PlaybackEngine


class ScriptError(ValueError):
    """The script file cannot be used; the message names the file and line."""


def read_script(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ScriptError(f"cannot read script {path}: {exc.strerror}") from exc
    completions = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        if not isinstance(entry, dict) or not isinstance(entry.get("completion"), str):
            raise ScriptError(f'{path}:{number}: expected an object like {{"completion": "<Harmony text>"}}')
        completions.append(entry["completion"])
    if not completions:
        raise ScriptError(f"{path}: the script has no completions")
    return completions


def scripted_engine(
    vocab: Vocab, completions: list[str], token_delay: float = 0.0, tokens_per_step: int = 1
) -> PlaybackEngine:
    lines = itertools.cycle([vocab.encode_harmony(completion) for completion in completions])

    def next_line(request: GenerationRequest) -> list[int]:
        return next(lines)

    return PlaybackEngine("scripted", next_line, token_delay, tokens_per_step)
