"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the right status.

Every failure a client can see goes through here; an unexpected exception becomes a plain 500 whose body
carries no stack trace (the log has it).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.engines.base import EngineError
from proxy.schema_errors import QUOTE_CHARS, quote

logger = logging.getLogger("harmony_proxy")

MAX_MESSAGE_CHARS = 2000  # a backstop: messages quote at most ~100 characters of a value (proxy/schema_errors.py)
MAX_PARAM_CHARS = 300
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # whatever a message quotes, an error stays small
            message = message[:MAX_MESSAGE_CHARS] + "..."
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param[:MAX_PARAM_CHARS] if param is not None else None
        self.code = code
        self.type = type or _default_type(status)
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_engine(exc: EngineError) -> APIError:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return APIError(exc.status, exc.message, code=exc.code, headers=headers)


def model_not_found(model: Any, served: str) -> APIError:
    """OpenAI's 404, and which model this server does serve (a first request often names another spelling)."""
    return APIError(
        404,
        f"The model `{_short(model)}` does not exist or you do not have access to it. This server serves "
        f"`{served}` (set by --served-model-name).",
        param="model",
        code="model_not_found",
        type="invalid_request_error",
    )


def _default_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable_error"
    return "invalid_request_error" if status < 500 else "server_error"


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def engine_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    return from_engine(exc).response()


async def store_unavailable_handler(request: Request, exc: Exception) -> Response:
    logger.debug("the response store failed: %s", exc)  # the store logs when it stops and starts answering
    return APIError(503, "The response store is unavailable; retry shortly.", code="store_unavailable",
                    type="server_error", headers={"Retry-After": "2"}).response()


async def unstorable_handler(request: Request, exc: Exception) -> Response:
    return APIError(400, f"The request holds a value the response store cannot keep: {exc}").response()


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Unknown route {request.method} {request.url.path}."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}."
    else:
        message = str(exc.detail)
    return APIError(exc.status_code, message, headers=exc.headers).response()


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return APIError(500, "The server had an error while processing your request.", type="server_error").response()


def _short(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= QUOTE_CHARS else quote(value)
