"""Which MCP servers a client may have this server connect to: the operator's `--mcp-allow` URL prefixes.

A client-supplied `server_url` makes this server send requests wherever the client points it (SSRF), so a URL is
allowed only under a prefix the operator named: the same scheme, host and port (an absent port is the scheme's
default), and a path that starts with the prefix's path at a `/` boundary (`/mcp` allows `/mcp` and `/mcp/x`,
never `/mcpx`). With no prefix, every client-supplied URL is refused.

Both sides are parsed by httpx2, the HTTP client the MCP SDK connects with, so the host and path compared are the
ones it will connect to and send (hosts lower-cased and IDNA-encoded, default ports dropped, dot segments removed)
and no two parsers can disagree about a URL. Refused outright: userinfo (`http://allowed@evil/` reaches `evil`),
whitespace, control characters and backslashes, percent-encoded dots, slashes and backslashes in the path (a
server or a proxy in front of it may decode them into a way out of the prefix), and hosts that are no DNS name or
IP address. A host's one trailing dot names the same host and is ignored.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

import httpx2

from proxy.server_tools.headers import REDACTED

DEFAULT_PORTS = {"http": 80, "https": 443}
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
_DNS_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_SHOWN_CHARS = 200


class McpUrlRefused(ValueError):
    """A `server_url` the allow-list refuses; the message says which rule and how the operator allows more."""


@dataclass(frozen=True)
class Target:
    """Where a URL connects: scheme, normalized host and port, and its path as it is sent (without the query)."""

    scheme: str
    host: str
    port: int
    path: str

    def shown(self) -> str:
        """The URL without userinfo, query or fragment (they may carry secrets), for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if DEFAULT_PORTS[self.scheme] == self.port else f":{self.port}"
        text = f"{self.scheme}://{host}{port}{self.path}"
        return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."

    def under(self, prefix: Target) -> bool:
        if (self.scheme, self.host, self.port) != (prefix.scheme, prefix.host, prefix.port):
            return False
        base = prefix.path.rstrip("/")
        return not base or self.path == base or self.path.startswith(base + "/")


def parse_target(url: object) -> tuple[Target, str]:
    """The URL's target and its normalized text (what the SDK is given); McpUrlRefused when it is unusable."""
    if not isinstance(url, str) or not url:
        raise McpUrlRefused("MCP server_url must be a non-empty string.")
    if _UNSAFE.search(url):
        raise McpUrlRefused("MCP server_url must not contain whitespace, control characters or backslashes.")
    try:
        parsed = httpx2.URL(url)
    except (httpx2.InvalidURL, ValueError, TypeError):
        raise McpUrlRefused("MCP server_url is not a valid URL.") from None
    if parsed.scheme not in DEFAULT_PORTS:
        raise McpUrlRefused("MCP server_url must be an http:// or https:// URL.")
    if parsed.userinfo:
        raise McpUrlRefused("MCP server_url must not contain a user name or password; send credentials in `headers`.")
    host = _host(parsed.raw_host.decode("ascii", "replace"))
    path = parsed.raw_path.decode("ascii", "replace").partition("?")[0] or "/"
    if _ENCODED_SEPARATOR.search(path):
        raise McpUrlRefused("MCP server_url must not percent-encode '.', '/' or '\\' in its path.")
    target = Target(parsed.scheme, host, parsed.port or DEFAULT_PORTS[parsed.scheme], path)
    return target, str(parsed)


def _host(raw: str) -> str:
    host = raw.lower()
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if not _DNS_NAME.fullmatch(host):
        raise McpUrlRefused("MCP server_url must name its host as a DNS name or an IP address.")
    return host


def url_secrets(url: str) -> tuple[str, ...]:
    """What a URL may carry that is a secret: its query (`?token=...`), each value as written and decoded, its
    userinfo and fragment."""
    try:
        parsed = httpx2.URL(url)
    except (httpx2.InvalidURL, ValueError, TypeError):
        return ()
    secrets = [parsed.userinfo.decode("ascii", "replace"), parsed.fragment]
    query = parsed.query.decode("ascii", "replace")
    if query:
        secrets.append(query)
        for pair in query.split("&"):
            value = pair.partition("=")[2]
            secrets += [value, urllib.parse.unquote_plus(value)]
    return tuple(secret for secret in secrets if secret)


def redacted_url(url: str) -> str:
    """The URL as it may be stored, shown or logged: each query value, and any userinfo or fragment, replaced."""
    try:
        parsed = httpx2.URL(url)
    except (httpx2.InvalidURL, ValueError, TypeError):
        return REDACTED
    pairs = parsed.query.decode("ascii", "replace").split("&")
    query = "&".join(f"{pair.partition('=')[0]}={REDACTED}" for pair in pairs if pair)
    return str(parsed.copy_with(userinfo=b"", fragment=None, query=query.encode() if query else None))


class McpAllowList:
    """The operator's allowed MCP URL prefixes (`--mcp-allow`, repeatable); `check` gates every client URL."""

    def __init__(self, prefixes: Sequence[str] = ()) -> None:
        targets = []
        for text in prefixes:
            try:
                target, _ = parse_target(text)
            except McpUrlRefused as exc:
                raise ValueError(f"--mcp-allow {text!r}: {exc}") from None
            if "?" in text or "#" in text:
                raise ValueError(f"--mcp-allow {text!r}: a prefix has no query or fragment")
            targets.append(target)
        self._prefixes: tuple[Target, ...] = tuple(targets)

    def __bool__(self) -> bool:
        return bool(self._prefixes)

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(target.shown() for target in self._prefixes)

    def permits(self, url: object) -> bool:
        try:
            self.check(url)
        except McpUrlRefused:
            return False
        return True

    def check(self, url: object) -> str:
        """The normalized URL to connect to, when a prefix allows it; else McpUrlRefused naming the rule."""
        target, normalized = parse_target(url)
        if not self._prefixes:
            raise McpUrlRefused(
                f"MCP server_url {target.shown()} is not allowed: this server connects only to MCP servers its "
                "operator allows with --mcp-allow URL-PREFIX, and it allows none.")
        if not any(target.under(prefix) for prefix in self._prefixes):
            raise McpUrlRefused(
                f"MCP server_url {target.shown()} is not allowed: it is under no --mcp-allow prefix (the scheme, "
                "host and port must be the prefix's and the path must start with the prefix's path at a '/').")
        return normalized
