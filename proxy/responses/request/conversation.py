"""Input items (stored history, then the new input) as the conversation the renderer reads.

Messages, reasoning (from its sealed blob, token for token as generated, where it opens), tool calls and their
outputs, a compaction's summary, Codex's agent messages and the items of tools the server ran become the
API-neutral items of `parsers/conversation.py`; settings and triggers say nothing to the model.
"""

from __future__ import annotations

from typing import Any

from parsers.conversation import AssistantMessage, Instructions, Item, Reasoning, ToolCall, ToolResult, UserMessage
from proxy.errors import invalid_request
from proxy.responses.agent_messages import agent_message_text, call_arguments
from proxy.responses.compaction_items import SUMMARY_HEADING, kept_before_compaction, latest_compaction
from proxy.responses.output.server_items import ServerItems
from proxy.responses.request.content import message_text, output_text
from proxy.responses.request.unseal import Unsealer
from tools.definitions import ToolError, make_tool, namespace_error


def conversation_of(items: list[dict[str, Any]], first_input: int, unsealer: Unsealer | None,
                    calls: dict[str, ToolCall] | None = None) -> list[Item]:
    """Items (history from `first_input` on: the new input) as the conversation the renderer reads; `unsealer`
    opens blobs (a 400 past the context window). `calls` (by call id) holds the calls of earlier items; the new
    calls are added to it."""
    conversation: list[Item] = []
    calls = {} if calls is None else calls
    server_items = ServerItems(items)
    # Reasoning before the last user message is not rendered (parsers/render.py): its blobs stay closed.
    last_user = max((position for position, item in enumerate(items)
                     if item["type"] == "message" and item["role"] == "user"), default=-1)
    compaction = latest_compaction(items)  # what precedes it is in its summary (proxy/responses/compaction_items.py)
    for position, item in enumerate(items):
        where = f"input[{position - first_input}]" if position >= first_input else "previous_response_id"
        kind = item["type"]
        if position < compaction and not kept_before_compaction(item):
            if kind == "function_call":  # an output after the compaction may still answer it
                calls[item["call_id"]] = ToolCall(item["call_id"], item["name"], call_arguments(item, unsealer, where),
                                                  _namespace(item, where))
            continue
        if kind == "compaction":
            blob = item.get("encrypted_content") or ""
            summary = unsealer.summary(blob, where) if position == compaction and unsealer is not None else None
            if summary is not None:
                conversation.append(UserMessage(SUMMARY_HEADING + summary))
        elif kind in ("compaction_trigger", "configuration_update"):
            continue  # a compaction asked for (routes), settings (configuration.py): nothing the model reads here
        elif kind == "message":
            text = message_text(item["content"], where)
            role = item["role"]
            if role == "user":
                conversation.append(UserMessage(text))
            elif role in ("system", "developer"):
                conversation.append(Instructions(text))
            elif text:
                conversation.append(AssistantMessage(text, preamble=_is_preamble(items, position)))
        elif kind == "reasoning":
            reasoning = _reasoning(item, unsealer if position > last_user else None, where)
            if reasoning is not None:
                conversation.append(reasoning)
        elif kind in ("function_call", "custom_tool_call"):
            freeform = kind == "custom_tool_call"
            arguments = item["input"] if freeform else call_arguments(item, unsealer, where)
            call = ToolCall(item["call_id"], item["name"], arguments, _namespace(item, where), freeform=freeform)
            try:
                make_tool(item["name"], None, None, None, where)
            except ToolError as exc:
                raise invalid_request(str(exc), param=exc.param) from None
            calls[item["call_id"]] = call
            conversation.append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call = calls.get(item["call_id"])
            if call is None:
                what = "custom tool" if kind == "custom_tool_call_output" else "function"
                raise invalid_request(f"No {what} call with call_id {item['call_id']!r} precedes this output.",
                                      param=f"{where}.call_id")
            conversation.append(ToolResult(item["call_id"], call.name, output_text(item["output"], where),
                                           call.namespace))
        elif kind == "agent_message":
            conversation.append(UserMessage(agent_message_text(item, unsealer, where)))
        elif kind == "additional_tools":
            continue  # its tools are declared with the request's own (client_tools.py)
        else:  # the items of tools the server ran (proxy/responses/output/server_items.py)
            conversation += server_items.read(item)
    return conversation


def _reasoning(item: dict[str, Any], unsealer: Unsealer | None, where: str) -> Reasoning | None:
    """The analysis a reasoning item stands for: from its blob when it opens (token for token as generated),
    else from its content or summary text; None when it has neither."""
    parts = item.get("content") or item.get("summary") or []
    text = "\n\n".join(part["text"] for part in parts if part.get("text"))
    blob = item.get("encrypted_content")
    sealed = unsealer.reasoning(blob, where) if blob and unsealer is not None else None
    if sealed is not None:
        return Reasoning(sealed.text or text, sealed.tokens)
    return Reasoning(text) if text else None


def _namespace(item: dict[str, Any], where: str) -> str | None:
    namespace = item.get("namespace")
    problem = namespace_error(namespace) if namespace is not None else None
    if problem is not None:
        raise invalid_request(problem, param=f"{where}.namespace")
    return namespace


def _is_preamble(items: list[dict[str, Any]], position: int) -> bool:
    """An assistant message is a commentary preamble when it says so, or when a function call follows it."""
    phase = items[position].get("phase")
    if phase is not None:
        return phase == "commentary"
    for later in items[position + 1 :]:
        if later["type"] != "reasoning":
            return later["type"] in ("function_call", "custom_tool_call")
    return False
