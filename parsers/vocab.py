"""The Harmony vocabulary, loaded once at start-up with no network access.

openai-harmony downloads `o200k_base.tiktoken` on first use, which fails in air-gapped clusters. We ship a
verified gzip copy inside the package, check its hash, and point the library at it for the one load call.
A `TIKTOKEN_ENCODINGS_BASE` the user set wins; its file is hash-checked too, since gpt-oss needs exactly it.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

from tools.long_runs import LONG_RUN

# The o200k pre-tokenizer split (tiktoken's o200k_base `pat_str`), which the Harmony encoding shares.
_O200K_PIECES = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
)
O200K_PATTERN = "|".join(_O200K_PIECES)

VOCAB_FILE_NAME = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
BUNDLED_VOCAB = Path(__file__).parent / "data" / (VOCAB_FILE_NAME + ".gz")

# Long runs (tools/long_runs.py) are encoded in chunks, which changes their tokens only at the cuts, so
# tokenization stays linear. Shorter text is encoded whole.
_RUN_CHUNK = 256

_SPECIAL_SPELLING = re.compile(r"<\|[A-Za-z0-9_]+\|>")


class VocabError(RuntimeError):
    """The vocabulary file is missing, unreadable, or not the one gpt-oss was trained with."""


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the Harmony control tokens the parser and renderer act on."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int
    return_: int
    call: int


class Vocab:
    """The Harmony encoding plus the per-token tables the streaming parser reads on its hot path.

    openai-harmony decodes one token per Rust call (about 0.3 us); the parser instead indexes `token_text`,
    a list built once here, and only falls back to an incremental UTF-8 decoder for tokens that hold part
    of a multi-byte character.
    """

    def __init__(self, encoding: HarmonyEncoding, vocab_bytes: bytes) -> None:
        self.encoding = encoding
        self.token_bytes: list[bytes] = _token_table(vocab_bytes)
        self.token_text: list[str | None] = [_whole_utf8(piece) for piece in self.token_bytes]
        # Every id at or above this one is a special token (o200k_harmony puts them all above the text ranks).
        self.text_token_count = len(self.token_bytes)
        self.special_ids: dict[str, int] = {
            encoding.decode([token]): token
            for token in range(self.text_token_count, self.text_token_count + len(encoding.special_tokens_set))
        }
        self.vocab_size = self.text_token_count + len(self.special_ids)  # valid ids are 0 .. vocab_size - 1
        ids = self.special_ids
        self.special = SpecialTokens(
            start=ids["<|start|>"],
            end=ids["<|end|>"],
            message=ids["<|message|>"],
            channel=ids["<|channel|>"],
            constrain=ids["<|constrain|>"],
            return_=ids["<|return|>"],
            call=ids["<|call|>"],
        )
        # Generation ends on <|return|> (final answer) and <|call|> (tool call).
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(encoding.stop_tokens_for_assistant_actions()))

    def encode(self, text: str) -> list[int]:
        """Encode text that must stay text: special-token spellings in it become ordinary tokens."""
        if len(text) < 1024 or not LONG_RUN.search(text):
            return self.encoding.encode(text, disallowed_special=())
        tokens: list[int] = []
        position = 0
        for run in LONG_RUN.finditer(text):
            tokens += self.encoding.encode(text[position : run.start()], disallowed_special=())
            for start in range(run.start(), run.end(), _RUN_CHUNK):
                tokens += self.encoding.encode(text[start : min(start + _RUN_CHUNK, run.end())], disallowed_special=())
            position = run.end()
        return tokens + self.encoding.encode(text[position:], disallowed_special=())

    def encode_harmony(self, text: str) -> list[int]:
        """Encode Harmony text: `<|start|>` and friends become the special tokens they spell."""
        tokens: list[int] = []
        position = 0
        for spelling in _SPECIAL_SPELLING.finditer(text):
            token = self.special_ids.get(spelling.group())
            if token is not None:
                tokens += self.encode(text[position : spelling.start()])
                tokens.append(token)
                position = spelling.end()
        return tokens + self.encode(text[position:])

    def decode(self, tokens: Sequence[int]) -> str:
        """Decode tokens to text, special tokens spelled out (for display, never for API fields)."""
        return self.encoding.decode(list(tokens))

    def is_special(self, token: int) -> bool:
        return token >= self.text_token_count


def load_vocab(environ: Mapping[str, str] = os.environ) -> Vocab:
    """Load the Harmony encoding without touching the network; raise VocabError with a clear message."""
    user_dir = environ.get("TIKTOKEN_ENCODINGS_BASE")
    if user_dir:
        vocab_bytes = _read_user_vocab(Path(user_dir) / VOCAB_FILE_NAME)
        folder = contextlib.nullcontext(user_dir)
    else:
        vocab_bytes = _read_bundled_vocab()
        folder = _unpacked(vocab_bytes)
    with folder as directory, _environment("TIKTOKEN_ENCODINGS_BASE", directory):
        encoding = _load_encoding(directory)
    return Vocab(encoding, vocab_bytes)


def _read_bundled_vocab() -> bytes:
    try:
        data = gzip.decompress(BUNDLED_VOCAB.read_bytes())
    except (OSError, EOFError) as exc:
        raise VocabError(f"cannot read the bundled Harmony vocabulary {BUNDLED_VOCAB}: {exc}") from exc
    _check_hash(data, str(BUNDLED_VOCAB))
    return data


def _read_user_vocab(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VocabError(
            f"TIKTOKEN_ENCODINGS_BASE is set, but {path} cannot be read ({exc.strerror}); "
            f"put {VOCAB_FILE_NAME} there or unset TIKTOKEN_ENCODINGS_BASE to use the bundled copy"
        ) from exc
    _check_hash(data, str(path))
    return data


def _check_hash(data: bytes, where: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != VOCAB_SHA256:
        raise VocabError(
            f"{where} is not the gpt-oss vocabulary {VOCAB_FILE_NAME}: sha256 {digest}, expected {VOCAB_SHA256}"
        )


def _load_encoding(directory: str) -> HarmonyEncoding:
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # openai-harmony raises HarmonyError, a RuntimeError subclass in some versions
        raise VocabError(f"openai-harmony could not load the vocabulary from {directory}: {exc}") from exc


@contextlib.contextmanager
def _unpacked(vocab_bytes: bytes) -> Iterator[str]:
    """A private temporary folder holding the vocabulary file; the library reads it once and keeps it in memory."""
    directory = tempfile.mkdtemp(prefix="harmony-proxy-vocab-")
    try:
        Path(directory, VOCAB_FILE_NAME).write_bytes(vocab_bytes)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    # openai-harmony reads this variable from the process environment during the load call only.
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _token_table(vocab_bytes: bytes) -> list[bytes]:
    """Token id -> bytes, from the tiktoken file's `base64 rank` lines (ranks are dense from 0)."""
    pairs = [line.split() for line in vocab_bytes.splitlines() if line]
    table = [b""] * len(pairs)
    for encoded, rank in pairs:
        table[int(rank)] = base64.b64decode(encoded)
    return table


def _whole_utf8(piece: bytes) -> str | None:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None
