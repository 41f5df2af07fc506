"""`--api-key`: every route then needs `Authorization: Bearer <key>`, except /health (for probes).

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which gets in the way of streaming responses).
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import APIError


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):  # constant time: no key guessing by timing
                error = APIError(401, "Incorrect API key provided.", code="invalid_api_key", type="invalid_request_error")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
