"""Server logs: one access line per request, the request id on every line about a request, text or JSON.

The access line is written from the request's record when the request ends (`proxy/telemetry/request_record.py`): id,
route, status, model, token counts, time to first token, duration, finish reason, and whether the client left
early. It never holds a prompt or a key; with `--log-requests` a separate line holds the request's body and
headers, never its `Authorization` (nor other credential headers), nor the secrets a Responses request carries
for MCP servers (`tools[*].headers` values and `tools[*].authorization`: `redact_body`).

`--log-format json` writes every line of the server (uvicorn's too) as one JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from proxy.server_tools.allow import redacted_url
from proxy.server_tools.headers import REDACTED
from proxy.telemetry.request_record import RequestRecord, current_record

access_logger = logging.getLogger("harmony_proxy.access")
requests_logger = logging.getLogger("harmony_proxy.requests")
LOG_FORMATS = ("text", "json")
MAX_LOGGED_BODY = 1 << 20  # --log-requests: longer bodies are cut here
SECRET_HEADERS = frozenset({b"authorization", b"proxy-authorization", b"cookie", b"x-api-key", b"api-key"})
QUIET_PATHS = frozenset({"/live", "/health", "/ready", "/metrics"})  # probes and scrapes: logged at debug level
_UNREADABLE = b"[not shown: not a JSON object, and it may hold MCP server credentials]"


class RequestIdFilter(logging.Filter):
    """Gives every log record the id of the request it was written for ("" outside any request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            current = current_record.get()
            record.request_id = current.request_id if current is not None else ""
        return True


# Control characters a client can put in a path, a header or a body (%0a, %00 ...): escaped in text lines, so
# that no client can forge a line or write a NUL. C1 controls and Unicode's line separators too.
_CONTROLS = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROLS.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def escape_controls(text: str) -> str:
    return text if text.isprintable() else text.translate(_CONTROLS)


class TextFormatter(logging.Formatter):
    """The server's usual lines, with ` [request id]` after the logger's name on lines about a request. A line's
    control characters are escaped (a traceback after it keeps its own lines)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s%(detail_text)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", "")
        record.request_tag = f" [{request_id}]" if request_id else ""
        detail = getattr(record, "detail", "")  # an access line's fields, as key=value
        record.detail_text = f" {detail}" if detail else ""
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:  # (logging's name)
        return escape_controls(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, and an access line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", ""):
            entry["request_id"] = record.request_id  # type: ignore[attr-defined]
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore")


def configure_logging(level: str, log_format: str = "text") -> None:
    """The root handler of a server process (the CLI, each worker, the engine host)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # The HTTP clients log each request they send at INFO: every upstream call would be logged twice (the access
    # line says it already). Their lines stay at --log-level debug.
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)


def access_fields(record: RequestRecord, model: str) -> dict[str, Any]:
    """What the access line says about a finished request, most telling first."""
    fields: dict[str, Any] = {"method": record.method, "path": record.path, "status": record.status}
    outcome = record.outcome
    if outcome is not None:
        fields["model"] = model  # the one model served: a request that generated asked for exactly it
        fields["prompt_tokens"] = outcome.prompt_tokens
        fields["completion_tokens"] = outcome.completion_tokens
        fields["reasoning_tokens"] = outcome.reasoning_tokens
        if outcome.cached_tokens is not None:
            fields["cached_tokens"] = outcome.cached_tokens
        if record.first_token_at is not None:
            fields["ttft_ms"] = _ms(record.first_token_at - record.started)
    if record.ended is not None:
        fields["duration_ms"] = _ms(record.ended - record.started)
    if outcome is not None:
        fields["finish_reason"] = record.finish_reason
    fields["client_left"] = record.client_left
    if outcome is not None:
        fields["tool_calls"] = record.tool_calls
        if record.queued_seconds is not None:
            fields["queued_ms"] = _ms(record.queued_seconds)
    if record.error_kind is not None:
        fields["engine_error"] = record.error_kind
    fields.update(streamed=record.streamed, route=record.route, api=record.api)
    if outcome is not None:
        fields["response_id"] = record.response_id
    if record.background:
        fields["background"] = True
    return fields


def write_access_line(record: RequestRecord, model: str) -> None:
    level = logging.DEBUG if record.path in QUIET_PATHS and record.status < 400 else logging.INFO
    if not access_logger.isEnabledFor(level):
        return
    fields = access_fields(record, model)
    detail = " ".join(f"{key}={_text(value)}" for key, value in fields.items()
                      if key not in ("method", "path", "status"))
    access_logger.log(level, "%s %s %d", record.method, record.path, record.status,
                      extra={"fields": fields, "detail": detail, "request_id": record.request_id})


def write_request_line(record: RequestRecord, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """--log-requests: the body as received and the headers but credentials."""
    shown = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers if name not in SECRET_HEADERS}
    body = redact_body(body)
    text = body[:MAX_LOGGED_BODY].decode("utf-8", "replace")
    if len(body) > MAX_LOGGED_BODY:
        text += f"... ({len(body)} bytes in all)"
    fields = {"method": record.method, "path": record.path, "headers": shown, "body": text}
    requests_logger.info("%s %s request", record.method, record.path, extra={
        "fields": fields, "detail": f"headers={json.dumps(shown)} body={text}", "request_id": record.request_id})


def redact_body(body: bytes) -> bytes:
    """The body with every secret a Responses request may carry for MCP servers replaced by REDACTED, wherever it
    is written (a `tools` given twice, or as an object): each `headers` object's values, each `authorization`,
    and each `server_url`'s query values. A body that may hold one but is no JSON (the server refused it) is not
    shown at all: it cannot be cleaned."""
    if not any(key in body for key in (b'"headers"', b'"authorization"', b'"server_url"', b"\\u")):
        return body  # the keys may be written with escapes
    try:
        data = json.loads(body, object_pairs_hook=_redacted_object)
    except (ValueError, RecursionError):
        return _UNREADABLE
    return json.dumps(data, ensure_ascii=False).encode()


def _redacted_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object, its secrets replaced; a key given twice is shown once, with its last value (as read)."""
    shown: dict[str, Any] = {}
    for key, value in pairs:
        if key == "headers" and isinstance(value, dict):
            value = dict.fromkeys(value, REDACTED)
        elif key == "authorization" and value is not None:
            value = REDACTED
        elif key == "server_url" and isinstance(value, str):
            value = redacted_url(value)
        shown[key] = value
    return shown


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
