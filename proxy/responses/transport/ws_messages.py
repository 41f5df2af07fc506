"""The messages a client sends on the Responses WebSocket, read and checked before anything looks at them.

A frame is a JSON object, text or binary: a binary frame is read as UTF-8 text, as a text frame is, and bytes that
are not UTF-8 end the connection with close code 1007, as RFC 6455 has for text. Each message type has a JSON
Schema for the fields the connection reads (`response.create`'s body is checked as over HTTP): a value of the
wrong type is an `error` event naming it, never an exception in the handler.
"""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.errors import invalid_request
from proxy.schema_errors import quote
from proxy.validation import LARGE_BODY_BYTES, check, compile_schema, decode_json_object

INVALID_UTF8 = 1007  # RFC 6455: data in a message that is not consistent with its type
_ID = {"type": "string", "maxLength": 256}
_CREATE = compile_schema({"type": "object", "properties": {"response": {"type": "object"}}})
_CANCEL = compile_schema({"type": "object", "required": ["response_id"], "properties": {"response_id": _ID}})
_PROCESSED = compile_schema({"type": "object", "properties": {"response_id": _ID}})
MESSAGES = {"response.create": _CREATE, "response.cancel": _CANCEL, "response.processed": _PROCESSED,
            "response.steer": None}


class NotText(Exception):
    """A binary frame whose bytes are not UTF-8."""


def frame_text(message: dict[str, Any]) -> str:
    """The text of a received frame, text or binary; NotText for a binary one that is not UTF-8."""
    text = message.get("text")
    if text is not None:
        return text
    try:
        return (message.get("bytes") or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise NotText from None


async def read_message(text: str) -> tuple[str, dict[str, Any]]:
    """(its type, the message), checked; an APIError for anything malformed. A large one is decoded off the loop."""
    raw = text.encode()
    data = decode_json_object(raw) if len(raw) < LARGE_BODY_BYTES else \
        await asyncio.to_thread(decode_json_object, raw, True)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in MESSAGES:
        raise invalid_request(f"Unknown event type {quote(kind)}: send `response.create`.", param="type",
                              code="invalid_event")
    schema = MESSAGES[kind]
    if schema is not None:
        check(data, schema)
    return kind, data
