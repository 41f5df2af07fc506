"""Sealed blobs: what the server hands a stateless client to carry and send back, unreadable and unforgeable.

`encrypted_content` of a reasoning item holds the token ids of the model's analysis message, so that sent back
it renders token for token as the model wrote it; a `compaction` item's holds the compacted conversation; an
encrypted tool parameter (Codex's sub-agent messages, proxy/responses/agent_messages.py) holds its text. All
are AES-GCM (`cryptography`) under a key the operator gives (`--reasoning-key`, or HARMONY_PROXY_REASONING_KEY,
shared by replicas) or, without one, a random key made at start.

A blob is `base64url(version | key id | nonce | ciphertext)`. The associated data binds the issuer, the
version, the key id and the kind of blob (a compaction blob cannot pass as reasoning). The plaintext is a
zlib-compressed JSON object. A blob that is not ours, was altered, was sealed under another key or by another
version opens to None, with a warning in the log (or told to the caller's `refused`): the caller falls back on
the item's plain text, so a long session never fails on an old blob. A few hundred characters may hold tens of
thousands of tokens, so a blob is decompressed within a limit the caller gives (`TooLarge` past it;
proxy/responses/request/unseal.py budgets a request's blobs).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import secrets
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

logger = logging.getLogger("harmony_proxy")

KEY_ENV = "HARMONY_PROXY_REASONING_KEY"
VERSION = 1
ISSUER = b"harmony-proxy"
REASONING, COMPACTION, AGENT_MESSAGE = "reasoning", "compaction", "agent_message"
_KEY_ID_BYTES, _NONCE_BYTES = 8, 12
_HEADER = 1 + _KEY_ID_BYTES + _NONCE_BYTES
MIN_SECRET_CHARS = 16


class TooLarge(Exception):
    """A blob whose plaintext is longer than the caller allowed: decompression stopped at the limit."""


@dataclass(frozen=True)
class SealedReasoning:
    """What a reasoning blob holds: the analysis body's token ids as generated, or, when the generation failed
    before the parser gave them, its text."""

    tokens: tuple[int, ...] | None
    text: str


class Sealer:
    def __init__(self, secret: str | None = None) -> None:
        """`secret`: any string of at least MIN_SECRET_CHARS characters (a key is derived from it); None makes a
        random key, good for this process only."""
        self.random = secret is None
        if secret is None:
            secret = secrets.token_urlsafe(32)
        elif len(secret) < MIN_SECRET_CHARS:
            raise ValueError(f"the reasoning key must have at least {MIN_SECRET_CHARS} characters")
        material = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                        info=b"harmony-proxy sealed blobs").derive(secret.encode())
        self._aead = AESGCM(material)
        self.key_id = hashlib.sha256(b"harmony-proxy key id" + material).digest()[:_KEY_ID_BYTES]
        # How every blob sealed here begins (9 bytes are 12 base64 characters): finds them inside other text.
        self.prefix = base64.urlsafe_b64encode(bytes([VERSION]) + self.key_id).decode("ascii")

    def seal(self, kind: str, payload: dict[str, Any]) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        plain = zlib.compress(json.dumps(payload, separators=(",", ":")).encode(), 6)
        header = bytes([VERSION]) + self.key_id + nonce
        sealed = self._aead.encrypt(nonce, plain, self._associated(kind, VERSION, self.key_id))
        return base64.urlsafe_b64encode(header + sealed).decode("ascii")

    def open(self, kind: str, blob: str, max_bytes: int | None = None,
             refused: Callable[[str, str], None] | None = None) -> dict[str, Any] | None:
        """The payload, or None for a blob that is not one of ours under this key and version: `refused(kind, why)`
        is told why (by default, a warning in the log). `max_bytes`: the longest plaintext to decompress; a longer
        one raises TooLarge, having built no more."""
        payload = self._open(kind, blob, max_bytes)
        if isinstance(payload, str):
            (refused or _log_refused)(kind, payload)
            return None
        return payload

    def _open(self, kind: str, blob: str, max_bytes: int | None) -> dict[str, Any] | str:
        """The payload, or why there is none."""
        try:
            raw = base64.urlsafe_b64decode(blob.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raw = b""
        if len(raw) <= _HEADER:
            return "it is not a harmony-proxy blob"
        version, key_id, nonce = raw[0], raw[1:1 + _KEY_ID_BYTES], raw[1 + _KEY_ID_BYTES:_HEADER]
        if version != VERSION:
            return f"it was sealed by format version {version}, this server reads {VERSION}"
        if key_id != self.key_id:
            return "it was sealed under another key (set the same --reasoning-key on every replica)"
        try:
            plain = self._aead.decrypt(nonce, raw[_HEADER:], self._associated(kind, version, key_id))
            payload = json.loads(_decompress(plain, max_bytes))
        except (InvalidTag, zlib.error, ValueError):
            return "it does not authenticate (altered, or not a blob of this kind)"
        return payload if isinstance(payload, dict) else "its payload is not an object"

    def seal_reasoning(self, tokens: Sequence[int] | None, text: str) -> str:
        return self.seal(REASONING, {"tokens": list(tokens)} if tokens is not None else {"text": text})

    def open_reasoning(self, blob: str, max_bytes: int | None = None,
                       refused: Callable[[str, str], None] | None = None) -> SealedReasoning | None:
        payload = self.open(REASONING, blob, max_bytes, refused)
        if payload is None:
            return None
        tokens = payload.get("tokens")
        if isinstance(tokens, list) and all(type(token) is int and token >= 0 for token in tokens):
            return SealedReasoning(tuple(tokens), "")
        text = payload.get("text")
        if isinstance(text, str):
            return SealedReasoning(None, text)
        (refused or _log_refused)(REASONING, "its payload is empty")
        return None

    @staticmethod
    def _associated(kind: str, version: int, key_id: bytes) -> bytes:
        return b"|".join([ISSUER, bytes([version]), key_id, kind.encode()])


def _decompress(plain: bytes, max_bytes: int | None) -> bytes:
    if max_bytes is None:
        return zlib.decompress(plain)
    inflater = zlib.decompressobj()
    data = inflater.decompress(plain, max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"the blob holds more than {max_bytes} bytes")
    data += inflater.flush()
    if not inflater.eof:
        raise zlib.error("incomplete compressed data")
    return data


def _log_refused(kind: str, why: str) -> None:
    logger.warning("ignored the encrypted_content of a %s item: %s; rendering the item's text, if it has any",
                   kind, why)


def sealer_from(secret: str | None) -> Sealer:
    """The server's sealer; without a key, a random one, said in the log (blobs then last until a restart). Not a
    warning: for one process a random key is fine; workers and replicas are warned where they are set up."""
    sealer = Sealer(secret)
    if sealer.random:
        logger.info("encrypted_content is sealed with a random key made now: blobs stop opening after a restart "
                    "(--reasoning-key or %s keeps them)", KEY_ENV)
    return sealer
