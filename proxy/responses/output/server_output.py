"""Output items of the tools the server runs, and their streamed events, in the shapes of the openai SDK's types.

The fold (`proxy/responses/output/fold.py`) calls these at each point of an item's life; the tool loop adds the
`ToolEvent`s (a server's tools listed, a call's result, a call the client approved). Per kind, in order:

- `mcp_list_tools`: `output_item.added` (no tools yet), `mcp_list_tools.in_progress`, `.completed`,
  `output_item.done` with the tools;
- `mcp_call`: `output_item.added` (in_progress), `mcp_call.in_progress`, `mcp_call_arguments.delta`s as the model
  writes them, `mcp_call_arguments.done`, then once it ran `mcp_call.completed` or `.failed`, and
  `output_item.done` with `output` or `error`;
- `mcp_approval_request`: `output_item.added` and `.done` once its arguments are complete; the response ends there;
- `web_search_call`: once the model's call is complete, `output_item.added`, `web_search_call.in_progress`,
  `.searching`, and after the search `.completed` and `output_item.done`;
- `code_interpreter_call`: `output_item.added`, `code_interpreter_call.in_progress`,
  `code_interpreter_call_code.delta`s, `.done`, `code_interpreter_call.interpreting`, and after the run
  `.completed` and `output_item.done` (with the output as logs when the request includes
  `code_interpreter_call.outputs`).

Approval requests and web searches are placed in the output only once the model's call is complete: one cut off
mid-way never ran and could not be approved. The others, cut off, end `incomplete`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.responses.hosted import APPROVAL, CODE, MCP, WEB_SEARCH, CallTarget
from proxy.responses.request.item import Item, Payload
from proxy.server_tools.output import ToolOutput
from proxy.server_tools.session import parse_arguments

_ID_PREFIXES = {MCP: "mcp_", APPROVAL: "mcpr_", WEB_SEARCH: "ws_", CODE: "ci_"}
LAZY = frozenset({APPROVAL, WEB_SEARCH})  # placed in the output once the call is complete


@dataclass(frozen=True)
class ToolsListed:
    label: str
    tools: list[dict[str, Any]]


@dataclass(frozen=True)
class ApprovedCall:
    """A call the client approved (`mcp_approval_response`), about to run."""

    target: CallTarget
    arguments: str
    approval_request_id: str


@dataclass(frozen=True)
class CallResult:
    output: ToolOutput


ToolEvent = ToolsListed | ApprovedCall | CallResult


@dataclass
class ServerCall:
    """A call to a server-side tool, as the fold saw it: the tool loop runs it once the completion ended with it.
    `item` is None for a call past the response's limit on tool calls, which is not shown and not run."""

    target: CallTarget
    item: Item | None
    complete: bool = False

    @property
    def arguments(self) -> str:
        return self.item.text if self.item is not None else ""


def initial_body(target: CallTarget, new_id: Callable[[str], str], container_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {"id": new_id(_ID_PREFIXES[target.kind])}
    if target.kind in (MCP, APPROVAL):
        body.update(type="mcp_approval_request" if target.kind == APPROVAL else "mcp_call",
                    server_label=target.server_label, name=target.name, arguments="")
        if target.kind == MCP:
            body.update(status="in_progress", output=None, error=None, approval_request_id=None)
    elif target.kind == WEB_SEARCH:
        body.update(type="web_search_call", status="in_progress", action={"type": "search"})
    else:
        body.update(type="code_interpreter_call", status="in_progress", code="", container_id=container_id,
                    outputs=None)
    return body


def started(item: Item) -> list[Payload]:
    """At the start of the model's call."""
    if item.target.kind in LAZY:
        return []
    return [_added(item), _event(item, "response.mcp_call.in_progress" if item.target.kind == MCP
                                 else "response.code_interpreter_call.in_progress")]


def delta_events(item: Item) -> list[dict[str, Any]]:
    """The fields of the delta events the model's text becomes (none for lazy items)."""
    where = {"item_id": item.body["id"], "output_index": item.index}
    if item.target.kind == MCP:
        return [{"type": "response.mcp_call_arguments.delta", **where}]
    if item.target.kind == CODE:
        return [{"type": "response.code_interpreter_call_code.delta", **where}]
    return []


def written(item: Item) -> list[Payload]:
    """The model finished writing the call: it is ready to run (or, an approval request, to be sent)."""
    kind, text = item.target.kind, item.text
    if kind == MCP:
        return [_event(item, "response.mcp_call_arguments.done", arguments=text)]
    if kind == CODE:
        item.body["status"] = "interpreting"
        return [_event(item, "response.code_interpreter_call_code.done", code=text),
                _event(item, "response.code_interpreter_call.interpreting")]
    if kind == APPROVAL:
        return [_added(item), _done(item)]
    return [_added(item), _event(item, "response.web_search_call.in_progress"),
            _status(item, "searching", "response.web_search_call.searching")]


def cut_off(item: Item, was_written: bool) -> list[Payload]:
    """The model's output ended inside the call, or (`was_written`) the response was stopped while the call ran:
    it ends incomplete. A lazy item not placed yet is dropped."""
    if item.target.kind in LAZY and not was_written:
        return []
    item.body["status"] = "incomplete"
    payloads = []
    if not was_written and item.target.kind in (MCP, CODE):
        payloads.append(_event(item, "response.mcp_call_arguments.done", arguments=item.text) if item.target.kind == MCP
                        else _event(item, "response.code_interpreter_call_code.done", code=item.text))
    return [*payloads, _done(item)]


def finished(item: Item, output: ToolOutput, include_outputs: bool) -> list[Payload]:
    """The call ran: its result, and the item done."""
    kind = item.target.kind
    item.body["status"] = "failed" if output.failed else "completed"
    if kind == MCP:
        if output.failed:
            item.body["error"] = {"type": "mcp_tool_execution_error",
                                  "content": [{"type": "text", "text": output.text}]}
        else:
            item.body["output"] = output.text
        name = "response.mcp_call.failed" if output.failed else "response.mcp_call.completed"
    elif kind == CODE:
        item.body["outputs"] = [{"type": "logs", "logs": output.text}] if include_outputs else None
        name = "response.code_interpreter_call.completed"
    else:
        name = "response.web_search_call.completed"
    return [_event(item, name), _done(item)]


def body(item: Item) -> dict[str, Any]:
    """The item as it stands, the model's text folded in (an item without a target is whole: a tool listing)."""
    shown = dict(item.body)
    if item.target is None:
        return shown
    kind, text = item.target.kind, item.text
    if kind in (MCP, APPROVAL):
        shown["arguments"] = text
    elif kind == CODE:
        shown["code"] = text
    else:
        shown["action"] = search_action(item.target.name, text)
    return shown


def search_action(function: str, arguments: str) -> dict[str, Any]:
    """A browser call as a web_search_call's action: search (query), open_page (a URL given as the id; none for a
    link of a page), or find_in_page (the pattern; the page only by its cursor, so no URL is known)."""
    args = parse_arguments(arguments) or {}
    if function == "open":
        link = args.get("id")
        return {"type": "open_page", "url": link if isinstance(link, str) else None}
    if function == "find":
        pattern = args.get("pattern")
        return {"type": "find_in_page", "pattern": pattern if isinstance(pattern, str) else "", "url": ""}
    query = args.get("query")
    return {"type": "search", "query": query if isinstance(query, str) else None}


def listed_items(label: str, tools: list[dict[str, Any]], item_id: str, index: int) -> list[Payload]:
    """An `mcp_list_tools` item, whole: it is listed before the response starts."""
    item = {"id": item_id, "type": "mcp_list_tools", "server_label": label, "tools": tools, "error": None}
    where = {"item_id": item_id, "output_index": index}
    return [{"type": "response.output_item.added", "output_index": index, "item": {**item, "tools": []}},
            {"type": "response.mcp_list_tools.in_progress", **where},
            {"type": "response.mcp_list_tools.completed", **where},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def approved(item: Item) -> list[Payload]:
    """An approved call's item: added, in progress, and its arguments (known whole) as one delta."""
    return [_added(item), _event(item, "response.mcp_call.in_progress"),
            _event(item, "response.mcp_call_arguments.delta", delta=item.text),
            _event(item, "response.mcp_call_arguments.done", arguments=item.text)]


def _added(item: Item) -> Payload:
    return {"type": "response.output_item.added", "output_index": item.index, "item": body(item)}


def _done(item: Item) -> Payload:
    return {"type": "response.output_item.done", "output_index": item.index, "item": body(item)}


def _event(item: Item, name: str, **fields: Any) -> Payload:
    return {"type": name, "item_id": item.body["id"], "output_index": item.index, **fields}


def _status(item: Item, status: str, name: str) -> Payload:
    item.body["status"] = status
    return _event(item, name)
