"""One llguidance tokenizer per vocabulary for the whole test session (it takes a second or more to build)."""

from __future__ import annotations

import functools

from parsers.vocab import Vocab
from proxy.engines.matcher import GrammarMatchers


@functools.cache
def session_matchers(vocab: Vocab) -> GrammarMatchers:
    return GrammarMatchers(vocab)
