"""`--api-key`: every route then needs `Authorization: Bearer <key>`, except /health (for probes).

The scheme is matched in any case (`bearer`, `BEARER`: RFC 9110 section 11.1), the key exactly. A WebSocket
(`/v1/responses`) takes the same header; a browser, which cannot set headers on a WebSocket, offers the key as
a subprotocol instead, `openai-insecure-api-key.<key>`, as OpenAI's Realtime API takes it. A refused upgrade is
answered 401 with the error body where the server can answer an upgrade with a response (uvicorn can), else
closed with 1008 (policy violation).

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which gets in the way of streaming responses).
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import APIError

KEY_SUBPROTOCOL = "openai-insecure-api-key."


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, public: frozenset[str] = frozenset({"/health"})) -> None:
        """`public`: paths that need no key (/health; /metrics with --metrics-public)."""
        self.app = app
        self._expected = api_key.encode()
        self._public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self._public:
            if not self._authorized(scope):
                await _refusal().response()(scope, receive, send)
                return
        elif scope["type"] == "websocket" and not (self._authorized(scope) or self._offered_key(scope)):
            if "websocket.http.response" in scope.get("extensions", {}):
                error = _refusal()
                body = error.response().body
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
                await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
                await send({"type": "websocket.http.response.body", "body": body})
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": "Incorrect API key provided."})
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        scheme, _, key = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
        # constant time over the key: no guessing it by timing
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.lstrip(b" "), self._expected)

    def _offered_key(self, scope: Scope) -> bool:
        return any(name.startswith(KEY_SUBPROTOCOL)
                   and hmac.compare_digest(name[len(KEY_SUBPROTOCOL):].encode(), self._expected)
                   for name in scope.get("subprotocols") or ())


def _refusal() -> APIError:
    return APIError(401, "Incorrect API key provided.", code="invalid_api_key", type="invalid_request_error")
