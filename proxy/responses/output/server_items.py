"""Server-side tool items a client sends back (openai-agents replays its output items; `previous_response_id`
brings them from the store): their JSON Schemas, and what each means in the conversation the model sees.

- `mcp_list_tools`: nothing (the current request's tools are declared in the developer message);
- `mcp_call`: the call as the model wrote it and its result (or error) as the tool's message;
- `mcp_approval_request`: the call, and, when the client declined it (or never answered and went on), a result
  saying so; an approved request is written where its `mcp_call` (with its `approval_request_id`) stands, which
  this server adds and runs when the approval arrives (`pending_approvals`);
- `code_interpreter_call`: the python call and its output, when the item carries its output (it does when the
  request included `code_interpreter_call.outputs`);
- `web_search_call`: nothing: it carries the search, never what the browser showed. Browser calls are the model's
  chain of thought (analysis), which the model no longer sees once its turn ended anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parsers.conversation import Item, ServerToolCall, ServerToolResult
from proxy.errors import invalid_request

_STRING = {"type": "string"}
_NULLABLE_STRING = {"type": ["string", "null"]}
_STATUS = {"type": ["string", "null"]}


def _object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


SERVER_ITEMS: dict[str, dict[str, Any]] = {
    "mcp_list_tools": _object(["server_label", "tools"], {
        "type": {"const": "mcp_list_tools"}, "id": _STRING, "server_label": _STRING, "error": _NULLABLE_STRING,
        "tools": {"type": "array", "items": _object(["name", "input_schema"], {
            "name": _STRING, "input_schema": {"type": "object"}, "description": _NULLABLE_STRING,
            "annotations": {"type": ["object", "null"]}})},
    }),
    "mcp_call": _object(["server_label", "name", "arguments"], {
        "type": {"const": "mcp_call"}, "id": _STRING, "server_label": _STRING, "name": _STRING,
        "arguments": _STRING, "output": _NULLABLE_STRING, "error": {"type": ["object", "string", "null"]},
        "status": _STATUS, "approval_request_id": _NULLABLE_STRING,
    }),
    "mcp_approval_request": _object(["id", "server_label", "name", "arguments"], {
        "type": {"const": "mcp_approval_request"}, "id": _STRING, "server_label": _STRING, "name": _STRING,
        "arguments": _STRING,
    }),
    "mcp_approval_response": _object(["approval_request_id", "approve"], {
        "type": {"const": "mcp_approval_response"}, "id": _NULLABLE_STRING, "approval_request_id": _STRING,
        "approve": {"type": "boolean"}, "reason": _NULLABLE_STRING,
    }),
    "web_search_call": _object([], {
        "type": {"const": "web_search_call"}, "id": _STRING, "status": _STATUS, "action": {"type": "object"},
    }),
    "code_interpreter_call": _object([], {
        "type": {"const": "code_interpreter_call"}, "id": _STRING, "status": _STATUS, "code": _NULLABLE_STRING,
        "container_id": _STRING, "outputs": {"type": ["array", "null"], "items": {
            "type": "object", "required": ["type"],
            "properties": {"type": {"enum": ["logs", "image"]}, "logs": _STRING, "url": _STRING}}},
    }),
}
ID_PREFIXES = {"mcp_list_tools": "mcpl_", "mcp_call": "mcp_", "mcp_approval_request": "mcpr_",
               "mcp_approval_response": "mcpa_", "web_search_call": "ws_", "code_interpreter_call": "ci_"}


@dataclass(frozen=True)
class PendingApproval:
    """An approved call that has not run yet."""

    request_id: str
    label: str
    name: str
    arguments: str


class ServerItems:
    """Reads the server-side items of one conversation (all its items given at once: an approval request is
    written according to what answered it, later in the list)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self._answers = {item["approval_request_id"]: item for item in items
                         if item["type"] == "mcp_approval_response"}
        self._ran = {item.get("approval_request_id") for item in items if item["type"] == "mcp_call"}

    def read(self, item: dict[str, Any]) -> list[Item]:
        kind = item["type"]
        if kind == "mcp_call":
            recipient = f"{item['server_label']}.{item['name']}"
            return [ServerToolCall(recipient, item["arguments"]), ServerToolResult(recipient, _call_output(item))]
        if kind == "mcp_approval_request":
            return self._approval_request(item)
        if kind == "code_interpreter_call" and item.get("outputs") is not None:
            logs = "\n".join(out.get("logs") or "" for out in item["outputs"] if out.get("type") == "logs")
            return [ServerToolCall("python", item.get("code") or "", "analysis", "code"),
                    ServerToolResult("python", logs, "analysis")]
        return []

    def _approval_request(self, item: dict[str, Any]) -> list[Item]:
        if item["id"] in self._ran:
            return []  # its mcp_call writes the call and the result
        recipient = f"{item['server_label']}.{item['name']}"
        answer = self._answers.get(item["id"])
        if answer is not None and answer["approve"]:
            return []  # about to run: the mcp_call this server adds writes it
        if answer is None:
            text = "This call needed the user's approval, which was not given; it did not run."
        else:
            reason = answer.get("reason")
            text = "The user declined this call; it did not run." + (f" Reason: {reason}" if reason else "")
        return [ServerToolCall(recipient, item["arguments"]), ServerToolResult(recipient, text)]


def pending_approvals(items: list[dict[str, Any]]) -> list[PendingApproval]:
    """The approved calls among `items` that have not run (no `mcp_call` names their request); a 400 for an
    approval of a request that is not there."""
    requests = {item["id"]: item for item in items if item["type"] == "mcp_approval_request"}
    ran = {item.get("approval_request_id") for item in items if item["type"] == "mcp_call"}
    pending = []
    for item in items:
        if item["type"] != "mcp_approval_response":
            continue
        request = requests.get(item["approval_request_id"])
        if request is None:
            raise invalid_request(f"No mcp_approval_request with id {item['approval_request_id']!r} precedes this "
                                  "approval: send it in `input` or continue with `previous_response_id`.",
                                  param="input", code="invalid_value")
        if item["approve"] and request["id"] not in ran and all(p.request_id != request["id"] for p in pending):
            pending.append(PendingApproval(request["id"], request["server_label"], request["name"],
                                           request["arguments"]))
    return pending


def _call_output(item: dict[str, Any]) -> str:
    error = item.get("error")
    if error is None:
        return item.get("output") or ""
    if isinstance(error, str):
        return error
    content = error.get("content")
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(error.get("message") or "The call failed.")
