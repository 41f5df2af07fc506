"""ASGI middleware that opens each request's record, names the request, and publishes the record at its end.

It gives every response an `x-request-id` header (the client's own when it is short and plain), makes the
request's record current for the layers below (`proxy/telemetry/request_record.py`), notices a client that leaves before
its answer is complete, and when the request ends hands the record to the metrics and the access log, once.

It sits inside KeepRawSend, so stream frames, which go to the server's own `send`, pass nothing of it: only a
response's start does. Errors nothing else handled are answered here (with the header), not by Starlette's
outermost middleware, which would answer them without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import unexpected_error_handler
from proxy.telemetry.access_log import write_access_line, write_request_line
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.request_record import RequestRecord, current_record, request_id_from
from proxy.telemetry.tracing import RequestTrace

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

logger = logging.getLogger("harmony_proxy")
_UNTRACED = frozenset({"/live", "/health", "/ready", "/metrics"})  # probes and scrapes, every few seconds: noise
_APIS = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions", "/tokenize": "tokenize"}


def api_of(route: str) -> str:
    """The API a route belongs to: a label with few values (metrics) that says which API a request used."""
    if route.startswith("/v1/responses"):
        return "responses"
    return _APIS.get(route, "none")


class RequestObserver:
    def __init__(
        self, app: ASGIApp, metrics: Metrics, model: str, routes: Mapping[Callable[..., Any], str], log_requests: bool,
        tracer: Tracer | None = None,
    ) -> None:
        """`routes`: each endpoint's path template, so that metrics are labelled by route, not by raw path;
        `tracer`: each request is traced (proxy/telemetry/tracing.py), its parent from the `traceparent` header."""
        self.app = app
        self._metrics = metrics
        self._model = model
        self._routes = routes
        self._log_requests = log_requests
        self._tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(request_id_from(scope["headers"]), scope["method"], scope["path"],
                               publish=self._publish)
        if self._tracer is not None and scope["path"] not in _UNTRACED:
            record.trace = RequestTrace.of_request(self._tracer, record.method, scope["headers"])
        request_id_header = (b"x-request-id", record.request_id.encode())
        body: list[bytes] | None = [] if self._log_requests else None

        async def observed_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not record.answered():
                    record.client_left = True
            elif body is not None and message["type"] == "http.request":
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    write_request_line(record, scope["headers"], b"".join(body))
                    body.clear()
            return message

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = [*message.get("headers", ()), request_id_header]  # a new list: some are shared
                message = {**message, "headers": headers}
                self._name_route(record, scope)
                if any(name == b"content-type" and value.startswith(b"text/event-stream") for name, value in headers):
                    record.streamed = True
                    self._metrics.stream_opened(record.api)
            await send(message)

        token = current_record.set(record)
        try:
            await self.app(scope, observed_receive, observed_send)
        except Exception as exc:
            if record.status != 0:
                raise  # the response started: the connection is all that can still be closed
            if record.client_left:
                record.status = 499  # nobody is there to answer
            else:
                response = await unexpected_error_handler(Request(scope), exc)  # it logs the error
                await response(scope, receive, observed_send)
        except asyncio.CancelledError:
            if record.status == 0:
                record.status = 499 if record.client_left else 503  # the server is shutting down
            raise
        finally:
            current_record.reset(token)
            if record.streamed:
                self._metrics.stream_closed(record.api)
            self._name_route(record, scope)
            record.finish()

    def _name_route(self, record: RequestRecord, scope: Scope) -> None:
        route = self._routes.get(scope.get("endpoint"))  # type: ignore[arg-type]
        if route is not None:
            record.route, record.api = route, api_of(route)

    def _publish(self, record: RequestRecord) -> None:
        publish(self._metrics, self._model, record)


def publish(metrics: Metrics, model: str, record: RequestRecord) -> None:
    """A finished request to the metrics and the access log (a WebSocket's responses publish theirs here too)."""
    try:
        if record.trace is not None:
            record.trace.finish(record)
        metrics.observe(record)
        write_access_line(record, model)
    except Exception:  # the answer is sent; a fault here must not turn into an error for the client
        logger.exception("could not record request %s", record.request_id)
