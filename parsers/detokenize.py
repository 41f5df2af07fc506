"""Token ids back to text as they stream, for raw completions (no Harmony parsing).

Special tokens are spelled out (`<|channel|>`) or skipped; a character split across tokens is held back until
its last byte arrives, so every delta is whole text and the deltas join to the full decode.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from parsers.vocab import Vocab


class Detokenizer:
    def __init__(self, vocab: Vocab, skip_special_tokens: bool) -> None:
        self._vocab = vocab
        self._skip_special = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._spellings: dict[int, str] = {}

    def feed(self, tokens: Sequence[int]) -> str:
        vocab, decoder = self._vocab, self._decoder
        pieces = []
        for token in tokens:
            if token < vocab.text_token_count:
                pieces.append(decoder.decode(vocab.token_bytes[token]))
            elif not self._skip_special:
                pieces.append(decoder.decode(b"", True))  # a half character before a special token stays broken
                pieces.append(self._spelling(token))
        return "".join(pieces)

    def flush(self) -> str:
        return self._decoder.decode(b"", True)

    def _spelling(self, token: int) -> str:
        if token not in self._spellings:
            try:
                self._spellings[token] = self._vocab.decode([token])
            except Exception:  # noqa: BLE001  # an id past the vocabulary (openai-harmony raises): nothing to show
                return ""
        return self._spellings[token]
