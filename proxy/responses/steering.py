"""Steering a response while it generates (`response.steer` over a WebSocket, OpenAI's Responses API beta).

A steer names a response running on the connection and brings user input. It is queued (`response.steer.accepted`:
the server owns it now) and the response stops at the next token boundary outside a tool call, `incomplete` with
`incomplete_details.reason: "steered"`. A successor follows at once on the same lane: the steered response's
settings, `previous_response_id` the steered response, the queued input as its input, in submission order; its
`response.created` is the commit point. Its prompt extends the steered response's tokens on the connection's
continuation (proxy/responses/turns.py): what the steered response generated, then the new user message.

A response that ends by itself before the boundary is followed by a successor too, unless it ends waiting for the
client's tool output: then the input stays queued (`response.steer.pending`, with `required_input` stubs for the
outputs) and goes first in the input of the `response.create` that continues that response. A steer that cannot
be taken, or input that cannot be committed, comes back in `response.steer.failed`.

What a connection's steers hold, queued and held together, is bounded in bytes by its turns' budget
(proxy/responses/turns.py `CONNECTION_BYTES`, measured as turns are): a steer past it fails with
`steer_budget_exceeded`, as one past `MAX_QUEUED` fails with `too_many_pending_steers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.ids import new_id
from proxy.responses.turns import CONNECTION_BYTES, value_bytes

MAX_QUEUED = 16  # steers waiting for one response
MAX_HELD = 32  # responses of a connection whose steers wait for the tool output that continues them
MAX_BYTES = CONNECTION_BYTES  # all of a connection's steers, queued or held
_TEXT = {"input_text", "text"}


class SteerError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Steer:
    id: str
    target: str  # the response it steers
    input: Any  # as sent: returned in `response.steer.failed`
    items: list[dict[str, Any]]  # the user messages, as input items
    size: int = 0  # bytes held by `input` and `items`


def read_steer(event: dict[str, Any]) -> Steer:
    """The steer of a `response.steer` event: only `type`, `previous_response_id` and `input`, and only user
    messages of text (gpt-oss reads text); a SteerError `invalid_input` says what is wrong."""
    extra = sorted(set(event) - {"type", "previous_response_id", "input"})
    if extra:
        raise SteerError("invalid_input", f"`response.steer` accepts only `type`, `previous_response_id` and `input`; "
                                          f"got {extra[0]!r}.")
    target, raw = event.get("previous_response_id"), event.get("input")
    if not isinstance(target, str) or not target:
        raise SteerError("invalid_input", "`previous_response_id` must name the response to steer.")
    if isinstance(raw, str):
        messages: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        messages = raw
    else:
        raise SteerError("invalid_input", "`input` must be a string or a non-empty array of user messages.")
    items = [_message(message, position) for position, message in enumerate(messages)]
    return Steer(new_id("steer_"), target, raw, items, value_bytes((raw, items)))


def _message(message: Any, position: int) -> dict[str, Any]:
    where = f"input[{position}]"
    if not isinstance(message, dict) or message.get("role") != "user" or message.get("type", "message") != "message":
        raise SteerError("invalid_input", f"{where}: steering accepts only messages with the `user` role.")
    content = message.get("content")
    if isinstance(content, str):
        return {"type": "message", "role": "user", "content": content}
    if not isinstance(content, list) or not content:
        raise SteerError("invalid_input", f"{where}.content must be a string or an array of content parts.")
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT or not isinstance(part.get("text"), str):
            raise SteerError("invalid_input", f"{where}.content[{index}]: gpt-oss reads text only; send "
                                              "`input_text` parts.")
    return {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": part["text"]} for part in content]}


def refusal(body: dict[str, Any]) -> SteerError | None:
    """OpenAI's rule: responses bound to a conversation or compacting themselves are not steered."""
    if body.get("conversation") is not None or body.get("context_management"):
        return SteerError("steering_not_supported", "Responses in a `conversation` or with `context_management` "
                                                    "cannot be steered.")
    return None


class Steers:
    """A connection's accepted steers: queued for a running response, or held for the create that continues a
    response which ended waiting for tool output (`MAX_QUEUED` per response, `MAX_HELD` responses held, `max_bytes`
    in all)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._queued: dict[str, list[Steer]] = {}
        self._held: dict[str, list[Steer]] = {}
        self._max_bytes = max_bytes
        self.used = 0  # bytes of the steers queued or held

    def queue(self, steer: Steer) -> None:
        queued = self._queued.setdefault(steer.target, [])
        if len(queued) >= MAX_QUEUED:
            raise SteerError("too_many_pending_steers", f"{MAX_QUEUED} steers already wait for this response.")
        if self.used + steer.size > self._max_bytes:
            raise SteerError("steer_budget_exceeded", f"The steers waiting on this connection would hold more than "
                                                      f"{self._max_bytes >> 20} MiB; send less, or wait for them to "
                                                      "be taken.")
        queued.append(steer)
        self.used += steer.size

    def take(self, response_id: str) -> list[Steer]:
        """The steers queued for a response that ended: no longer this connection's to hold (`hold` them, or
        they go into a create)."""
        steers = self._queued.pop(response_id, [])
        self.used -= sum(steer.size for steer in steers)
        return steers

    def hold(self, response_id: str, steers: list[Steer]) -> list[Steer]:
        """Keep `steers` for the create that continues `response_id`; those of the oldest response beyond
        `MAX_HELD` are dropped and returned (to be failed)."""
        self._held.setdefault(response_id, []).extend(steers)
        self.used += sum(steer.size for steer in steers)
        if len(self._held) <= MAX_HELD:
            return []
        return self._release(self._held.pop(next(iter(self._held))))

    def held_input(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with the steers held for its `previous_response_id` first in its input."""
        held = self._release(self._held.pop(body.get("previous_response_id"), [])) if isinstance(
            body.get("previous_response_id"), str) else None
        if not held:
            return body
        given = body.get("input")
        given = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        return {**body, "input": [*(item for steer in held for item in steer.items), *given]}

    def _release(self, steers: list[Steer]) -> list[Steer]:
        self.used -= sum(steer.size for steer in steers)
        return steers


def successor(body: dict[str, Any], response_id: str, steers: list[Steer]) -> dict[str, Any]:
    """The create that continues a steered response: its settings, the steers' input."""
    settings = {key: value for key, value in body.items() if key not in ("input", "previous_response_id")}
    return {**settings, "previous_response_id": response_id,
            "input": [item for steer in steers for item in steer.items]}


def required_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stubs of the outputs a response waits for: its client tool calls."""
    stubs = []
    for item in output:
        if item["type"] == "function_call":
            stubs.append({"type": "function_call_output", "call_id": item["call_id"], "name": item["name"]})
        elif item["type"] == "custom_tool_call":
            stubs.append({"type": "custom_tool_call_output", "call_id": item["call_id"]})
    return stubs


def accepted(steer: Steer) -> dict[str, Any]:
    return {"type": "response.steer.accepted", "steer": {"id": steer.id, "previous_response_id": steer.target}}


def pending(steer: Steer, required: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "response.steer.pending", "reason": "waiting_for_required_input", "required_input": required,
            "steer": {"id": steer.id, "previous_response_id": steer.target}}


def failed(error: SteerError, target: Any, raw: Any, steer_id: str | None = None) -> dict[str, Any]:
    steer = {"input": raw, "previous_response_id": target if isinstance(target, str) else ""}
    if steer_id is not None:
        steer["id"] = steer_id
    return {"type": "response.steer.failed", "steer": steer,
            "error": {"type": "invalid_request_error", "code": error.code, "message": error.message}}
