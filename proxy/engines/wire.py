"""The frames an engine host and its front ends exchange over a Unix socket (`host.py`, `remote.py`).

Every frame is a 9-byte header, `payload length, request handle, kind` in native byte order (both ends are on
one machine), then the payload. A handle numbers one request of one front-end connection, so many requests
share a connection. The hot path is a step: its token ids as packed 32-bit integers, nothing else. A request
is its `GenerationRequest` as JSON (the sampling settings and the output constraint, field by field) followed by
its prompt as packed 32-bit integers; the host builds it back from those fields alone. Nothing on this wire is
unpickled or otherwise able to run code, whoever reaches the socket (it is mode 0600 all the same: vLLM's and
SGLang's remote-code-execution advisories came from pickle on such internal channels). Errors travel as JSON.

Writes are batched: frames go to a buffer that is flushed once per event-loop turn, so the steps of every
request that advanced in that turn leave in one socket write.
"""

from __future__ import annotations

import asyncio
import json
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass
from typing import Any, NamedTuple

from proxy.engines.base import (
    ContextWindow,
    EngineError,
    FinishReason,
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    Step,
    Usage,
)
from tools.definitions import FunctionTool, ResponseFormat, ToolChoice
from tools.freeform import Freeform

VERSION = 4  # 1: requests were pickled; 2: the greeting had no context window; 3: nor KV-event sources
HEADER = struct.Struct("=IIB")  # payload length, handle, kind
_LAST = struct.Struct("=BBIIi")  # finish reason, has usage, prompt tokens, completion tokens, cached (-1: unknown)
_TOKEN = struct.Struct("=I")
_ONE_TOKEN_STEP = struct.Struct("=IIBI")  # the commonest frame whole: header and one token id
_FIELDS_LENGTH = struct.Struct("=I")  # a request: the length of its JSON fields, which its prompt follows
MAX_PAYLOAD = 1 << 30
MAX_TOKENS = (1 << 31) - 1  # token counts travel as 32-bit integers

# Front end to host.
SUBMIT = 1  # payload: a GenerationRequest, its fields as JSON then its prompt token ids
CANCEL = 2  # the front end closed the request's generator
HEALTH = 3  # run the engine's check_health
# Host to front end.
HELLO = 10  # sent once a connection is accepted, the engine loaded: version byte, engine name
STEP = 11  # a step that is not the last: token ids
LAST = 12  # the request's last frame: _LAST, then token ids (finish reason 0: ended without one)
ERROR = 13  # the request (or health check) failed: JSON {message, status, code}
HEALTHY = 14  # the health check passed

_FINISH_CODES: dict[FinishReason | None, int] = {None: 0, "stop": 1, "length": 2, "cancelled": 3, "error": 4}
_FINISH_REASONS: list[FinishReason | None] = [None, "stop", "length", "cancelled", "error"]


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def frame(kind: int, handle: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), handle, kind) + payload


def step_frame(handle: int, token_ids: Sequence[int]) -> bytes:
    if len(token_ids) == 1:
        return _ONE_TOKEN_STEP.pack(4, handle, STEP, token_ids[0])
    return HEADER.pack(4 * len(token_ids), handle, STEP) + array("I", token_ids).tobytes()


def last_frame(handle: int, step: Step) -> bytes:
    usage = step.usage
    fields = _LAST.pack(
        _FINISH_CODES[step.finish_reason],
        usage is not None,
        usage.prompt_tokens if usage else 0,
        usage.completion_tokens if usage else 0,
        -1 if usage is None or usage.cached_tokens is None else usage.cached_tokens,
    )
    return frame(LAST, handle, fields + array("I", step.token_ids).tobytes())


def error_frame(handle: int, error: EngineError) -> bytes:
    body = {"message": error.message, "status": error.status, "code": error.code}
    return frame(ERROR, handle, json.dumps(body).encode())


class Greeting(NamedTuple):
    """What the host says first: its engine's name, what the built engine takes (front ends advertise it), and
    where the engine publishes its KV-cache events (front ends answer `/kv_event_sources` with it)."""

    engine: str
    context_window: ContextWindow | None = None
    kv_event_sources: dict[str, Any] | None = None


def hello_frame(engine_name: str, window: ContextWindow | None = None,
                kv_event_sources: dict[str, Any] | None = None) -> bytes:
    """The greeting: the engine's name, what the built engine takes, and where it publishes its KV-cache events
    (front ends advertise both)."""
    body = {"engine": engine_name, "context_window": [window.total, window.prompt] if window is not None else None,
            "kv_event_sources": kv_event_sources}
    return frame(HELLO, 0, bytes([VERSION]) + json.dumps(body).encode())


def request_frame(handle: int, request: GenerationRequest) -> bytes:
    fields = json.dumps({
        "request_id": request.request_id,
        "sampling": _fields(request.sampling),
        "constraint": _fields(request.constraint),
        "routing_hints": request.routing_hints,
        "trace_headers": request.trace_headers,
    }, separators=(",", ":")).encode()
    prompt = array("I", request.prompt_token_ids).tobytes()
    return frame(SUBMIT, handle, _FIELDS_LENGTH.pack(len(fields)) + fields + prompt)


def read_tokens(data: bytes, start: int, end: int) -> list[int]:
    if end - start == 4:
        return [_TOKEN.unpack_from(data, start)[0]]
    with memoryview(data) as view:
        return view[start:end].cast("I").tolist()


def read_last(data: bytes, start: int, end: int) -> Step:
    finish, has_usage, prompt, completion, cached = _LAST.unpack_from(data, start)
    usage = Usage(prompt, completion, None if cached < 0 else cached) if has_usage else None
    return Step(read_tokens(data, start + _LAST.size, end), _FINISH_REASONS[finish], usage)


def read_error(payload: bytes) -> EngineError:
    body = json.loads(payload)
    return EngineError(body["message"], status=body["status"], code=body["code"])


def read_request(payload: bytes) -> GenerationRequest:
    """The request a SUBMIT frame carries, built from its fields; ProtocolError for anything else."""
    try:
        (length,) = _FIELDS_LENGTH.unpack_from(payload)
        fields = json.loads(payload[_FIELDS_LENGTH.size:_FIELDS_LENGTH.size + length])
        with memoryview(payload) as view:
            prompt = view[_FIELDS_LENGTH.size + length:].cast("I").tolist()
        sampling, constraint = dict(fields["sampling"]), fields["constraint"]
        sampling["stop_token_ids"] = tuple(sampling["stop_token_ids"])
        response_format = constraint["response_format"]
        return GenerationRequest(
            _string(fields["request_id"]),
            prompt,
            SamplingParams(**sampling),
            OutputConstraint(
                tuple(map(_tool, constraint["tools"])),
                ToolChoice(**constraint["tool_choice"]),
                ResponseFormat(**response_format) if response_format is not None else None,
                bool(constraint["parallel_tool_calls"]),
            ),
            tuple(map(_string, fields["routing_hints"])),
            tuple((_string(name), _string(value)) for name, value in fields["trace_headers"]),
        )
    except (ValueError, TypeError, KeyError, struct.error) as exc:  # JSON, fields, prompt length
        raise ProtocolError(f"not a request of this protocol: {exc!r}"[:300]) from None


def _fields(value: Any) -> Any:
    """A dataclass as a dict of its fields, nested ones too; JSON values (a tool's schema) as they are, not copied
    (dataclasses.asdict copies them: most of the cost of a request with tools)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {field.name: _fields(getattr(value, field.name)) for field in fields(value)}
    if isinstance(value, tuple):
        return [_fields(item) for item in value]
    return value


def _tool(body: dict[str, Any]) -> FunctionTool:
    freeform = body.get("freeform")
    return FunctionTool(**{**body, "freeform": Freeform(**freeform) if freeform is not None else None})


def _integer(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise TypeError(f"expected a positive integer, got {value!r}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def read_hello(payload: bytes) -> Greeting:
    if not payload or payload[0] != VERSION:
        raise ProtocolError(f"the engine host speaks another protocol version ({payload[:1]!r})")
    try:
        body = json.loads(payload[1:])
        window = body["context_window"]
        if window is not None:
            total, prompt = window
            window = ContextWindow(_integer(total), _integer(prompt))
        sources = body["kv_event_sources"]
        if sources is not None and not isinstance(sources, dict):
            raise TypeError("kv_event_sources is not an object")
        return Greeting(_string(body["engine"]), window, sources)
    except (ValueError, TypeError, KeyError) as exc:
        raise ProtocolError(f"a greeting that does not read: {exc}") from None


Handler = Callable[[int, int, bytes, int, int], None]  # kind, handle, and the payload: data[start:end]


class FrameReader:
    """Splits received bytes into frames and hands each to `handler`, in order; a frame announcing more than
    `max_payload` bytes is a ProtocolError as soon as its header arrives (nothing of it is buffered)."""

    def __init__(self, handler: Handler, max_payload: int = MAX_PAYLOAD) -> None:
        self._handler: Handler | None = handler
        self._max_payload = max_payload
        self._partial = bytearray()
        self._needed = HEADER.size  # bytes `_partial` must hold before it can be parsed again

    def close(self) -> None:
        """The connection is gone: what it buffered goes now, and so does the handler (its owner holds this reader:
        a cycle the collector would free only at its next full pass)."""
        self._handler = None
        self._partial = bytearray()

    def feed(self, data: bytes) -> None:
        if self._partial:
            self._partial += data
            if len(self._partial) < self._needed:
                return  # a large frame still arriving: do not rescan it chunk by chunk
            data = bytes(self._partial)
            self._partial.clear()
        handler = self._handler
        if handler is None:
            return  # closed
        offset, end, unpack, size, most = 0, len(data), HEADER.unpack_from, HEADER.size, self._max_payload
        while end - offset >= size:
            length, handle, kind = unpack(data, offset)
            if length > most:
                raise ProtocolError(f"a frame of {length} bytes (at most {most})")
            start = offset + size
            if start + length > end:
                self._needed = start + length - offset
                break
            handler(kind, handle, data, start, start + length)  # no slice: steps are read in place
            offset = start + length
        else:
            self._needed = size
        if offset < end:
            self._partial += data[offset:]


class FrameWriter:
    """Buffers frames and writes them in one call at the next turn of the event loop."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._frames: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def send(self, data: bytes) -> None:
        if not self._frames:
            self._loop.call_soon(self.flush)
        self._frames.append(data)

    def flush(self) -> None:
        frames, self._frames = self._frames, []
        if frames and not self._transport.is_closing():
            self._transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
