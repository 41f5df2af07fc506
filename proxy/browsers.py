"""Requests a web page makes: no cross-site request forgery, no DNS rebinding, CORS for the origins allowed.

A page on any site can make a browser send a "simple" request (a POST of `text/plain`, form data) to a server on
the user's machine, without asking first; and a name the attacker controls can be made to resolve to 127.0.0.1
(DNS rebinding), making the page same-origin with the server, so that it can read the answers too. So:

- `Host` must name this server: the loopback names always, the address it is bound to, and `--allowed-hosts`
  (with the server bound to a non-loopback address and no `--allowed-hosts`, any name: the names it is reached
  by are not known). Else 421, as the MCP SDK answers.
- A request whose `Origin` is another site's is refused (403) unless `--allowed-origins` lists it; requests
  from the server's own pages (the playground) and from clients that are not browsers (no `Origin`) pass.
- The same for a WebSocket handshake (browsers send one to any site, with its `Origin`, and no CORS applies).
- A POST with a content type a browser sends without asking (`text/plain`, `application/x-www-form-urlencoded`,
  `multipart/form-data`) is a 415: the routes read JSON.

CORS for the allowed origins (preflight and response headers) is Starlette's `CORSMiddleware`, inside this one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import APIError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY = "*"
_SIMPLE_CONTENT_TYPES = (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data")
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bound_to: str, named: Iterable[str]) -> tuple[str, ...]:
    """The host names requests may give: `(ANY,)` when bound beyond loopback and none are named."""
    named = tuple(name.strip().lower() for name in named if name.strip())
    if not named and not is_loopback(bound_to):
        return (ANY,)
    return tuple(dict.fromkeys((*LOOPBACK_NAMES, bound_to.lower().strip("[]"), *named)))


def _host_name(host: str) -> str:
    """`example.com:8000` -> `example.com`; `[::1]:8000` -> `::1`."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _without_default_port(netloc: str, scheme: str) -> str:
    port = _DEFAULT_PORTS.get(scheme)
    return netloc[: -len(port) - 1] if port and netloc.endswith(":" + port) else netloc


class BrowserGuard:
    """ASGI middleware: the Host, Origin and Content-Type checks above."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...], origins: tuple[str, ...]) -> None:
        self.app = app
        self._hosts = None if ANY in hosts else frozenset(hosts)
        self._origins = None if ANY in origins else frozenset(origin.rstrip("/").lower() for origin in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            error = self._refusal(scope)
            if error is not None:
                if scope["type"] == "http":
                    await error.response()(scope, receive, send)
                else:  # closed before it is accepted: the server answers the handshake 403
                    await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> APIError | None:
        host = origin = content_type = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1").lower()
            elif name == b"origin":
                origin = value.decode("latin-1").rstrip("/").lower()
            elif name == b"content-type":
                content_type = value.lower()
        if host is not None and self._hosts is not None and _host_name(host) not in self._hosts:
            return APIError(421, "The Host header names a host this server does not serve (see --allowed-hosts).",
                            code="invalid_host", type="invalid_request_error")
        if origin is not None and not self._allows_origin(origin, host, _page_scheme(scope)):
            return APIError(403, f"Requests from the origin {origin[:200]!r} are not allowed (see --allowed-origins).",
                            code="origin_not_allowed", type="invalid_request_error")
        simple = content_type is not None and content_type.startswith(_SIMPLE_CONTENT_TYPES)
        if scope.get("method") == "POST" and simple:
            return APIError(415, "Send the request body as JSON, with Content-Type: application/json.",
                            param="Content-Type", code="unsupported_media_type", type="invalid_request_error")
        return None

    def _allows_origin(self, origin: str, host: str | None, own_scheme: str) -> bool:
        """Listed, or this server's own origin: same scheme (an https page is another origin than the http
        server at the same host and port, RFC 6454), same host and port."""
        if self._origins is None or origin in self._origins:
            return True
        scheme, _, netloc = origin.partition("://")
        return host is not None and bool(netloc) and scheme == own_scheme and (
            _without_default_port(netloc, scheme) == _without_default_port(host, scheme)
        )


def _page_scheme(scope: Scope) -> str:
    """The scheme of this server's own pages: a WebSocket's `ws`/`wss` is served beside `http`/`https`."""
    scheme = scope.get("scheme", "http")
    return {"ws": "http", "wss": "https"}.get(scheme, scheme)
