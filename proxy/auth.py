"""`--api-key`: every route then needs `Authorization: Bearer <key>`, except /health (for probes).

The scheme is matched in any case (`bearer`, `BEARER`: RFC 9110 section 11.1), the key exactly.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which gets in the way of streaming responses).
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import APIError


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, public: frozenset[str] = frozenset({"/health"})) -> None:
        """`public`: paths that need no key (/health; /metrics with --metrics-public)."""
        self.app = app
        self._expected = api_key.encode()
        self._public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self._public:
            scheme, _, key = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            # constant time over the key: no guessing it by timing
            if scheme.lower() != b"bearer" or not hmac.compare_digest(key.lstrip(b" "), self._expected):
                error = APIError(401, "Incorrect API key provided.", code="invalid_api_key", type="invalid_request_error")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
