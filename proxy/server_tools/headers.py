"""Headers a client asks this server to send to an MCP server (an `Authorization` token, say): secrets.

They are sent and never shown: `repr` names the headers only, error messages never quote a value (`scrubber`:
every value, whatever its length, and the token of `Bearer <token>`), and what is stored or echoed is
`redacted()`, the same object with every value replaced. Caches key on `fingerprint(key)`, a
keyed hash that reveals nothing without the cache's own random key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping

REDACTED = "[redacted]"
MAX_HEADERS = 64
MAX_NAME_CHARS = 256
MAX_VALUE_CHARS = 8192
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field-name
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but tab: they would split the header
# Headers the MCP transports set themselves, or that would change how the request is framed or routed.
_RESERVED = frozenset({
    "host", "content-length", "content-type", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
    "upgrade", "accept", "mcp-session-id", "mcp-protocol-version", "last-event-id",
})


class HeaderError(ValueError):
    """Headers that cannot be sent; the message names the header, never its value."""


class ServerHeaders:
    """The headers for one MCP server, immutable; `values()` is for the transport alone."""

    __slots__ = ("_items",)

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        self._items: tuple[tuple[str, str], ...] = tuple(sorted((headers or {}).items(), key=lambda kv: kv[0].lower()))

    @classmethod
    def from_request(cls, value: object) -> ServerHeaders:
        """Check a request's `headers` field (an object of strings, or null); HeaderError says what is wrong."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise HeaderError("`headers` must be an object of header names to string values.")
        if len(value) > MAX_HEADERS:
            raise HeaderError(f"`headers` may hold at most {MAX_HEADERS} headers.")
        seen: set[str] = set()
        for name, text in value.items():
            if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not _TOKEN.fullmatch(name):
                raise HeaderError("`headers` has a name that is not a valid HTTP header name.")
            if name.lower() in _RESERVED:
                raise HeaderError(f"`headers` may not set {name}: the MCP transport sets it.")
            if name.lower() in seen:
                raise HeaderError(f"`headers` sets {name} twice.")
            seen.add(name.lower())
            if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS or _BAD_VALUE.search(text):
                raise HeaderError(f"`headers` value of {name} must be a string of at most {MAX_VALUE_CHARS} "
                                  "characters without line breaks or control characters.")
        return cls(value)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._items)

    def values(self) -> dict[str, str]:
        """The headers in clear: only for the HTTP client that sends them."""
        return dict(self._items)

    def redacted(self) -> dict[str, str]:
        """What may be stored or shown: each name with its value replaced."""
        return {name: REDACTED for name, _ in self._items}

    def fingerprint(self, key: bytes) -> str:
        """A keyed hash of the headers: equal for equal headers, useless without `key`."""
        digest = hmac.new(key, digestmod=hashlib.sha256)
        for name, text in self._items:
            digest.update(name.lower().encode() + b"\0" + text.encode() + b"\0")
        return digest.hexdigest()

    def secrets(self) -> tuple[str, ...]:
        """Every value, and the credential of `Bearer <token>` (a server may quote either)."""
        return tuple(secret for _, value in self._items for secret in (value, value.rpartition(" ")[2]))

    def scrub(self, text: str) -> str:
        """`text` with any header value in it replaced (an error message that quoted one, for instance)."""
        return scrubber(self.secrets())(text)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServerHeaders) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"ServerHeaders({', '.join(self.names)})"

    __str__ = __repr__


def scrubber(secrets: Iterable[str]) -> Callable[[str], str]:
    """A function that replaces every occurrence of every secret, however short, in one pass (longest first, so
    that no part of a longer secret is left, and no replacement is itself rewritten)."""
    unique = sorted({secret for secret in secrets if secret and secret.strip()}, key=len, reverse=True)
    if not unique:
        return _unchanged
    pattern = re.compile("|".join(map(re.escape, unique)))
    return functools.partial(pattern.sub, REDACTED)


def _unchanged(text: str) -> str:
    return text
