"""Item events → the output items of a response, and the streamed events that build them, from one fold.

Per item, the events come in the order the openai SDK's `responses.stream()` checks: `output_item.added`, then
for reasoning and messages `content_part.added`, text deltas, the text's `.done`, `content_part.done`; for a
function call its arguments' deltas and `.done`; then `output_item.done`. Ids and output indexes are the ones
the final response object holds.

The token path is hot: a text delta is a `(item, text)` tuple, the texts of one engine step for the same item
are one delta, and each item renders the start of its delta events once (`delta_prefixes`), so a delta costs
one JSON string escape when it is written (`proxy/responses/transport/frames.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from parsers.events import Event, ItemDone, ItemKind, ItemStarted
from proxy.responses.agent_messages import ArgumentSealer
from proxy.responses.hosted import HostedTools
from proxy.responses.output import server_output
from proxy.responses.output.server_output import ApprovedCall, CallResult, ServerCall, ToolEvent, ToolsListed
from proxy.responses.request.item import Item, Payload, TextDelta

# Seals a reasoning item's analysis (its token ids, or its text when the tokens are not known) into
# `encrypted_content` (proxy/responses/sealing.py).
Seal = Callable[[tuple[int, ...] | None, str], str]


class ResponseOutput:
    def __init__(
        self,
        new_id: Callable[[str], str],
        max_tool_calls: int | None = None,
        reasoning_summaries: bool = False,
        reasoning_event: str = "response.reasoning_text",
        hosted: HostedTools | None = None,
        max_server_calls: int | None = None,
        seal: Seal | None = None,
        leading: list[dict[str, Any]] | tuple[()] = (),
        custom_tools: frozenset[tuple[str | None, str]] = frozenset(),
        arguments: ArgumentSealer | None = None,
    ) -> None:
        """`leading`: whole items the output begins with (a compaction item), announced with the first events.
        `arguments` seals the encrypted parameters of calls: such a call's arguments come as one delta, sealed,
        when the call is complete (proxy/responses/agent_messages.py)."""
        self._new_id = new_id
        self._custom_tools = custom_tools  # (namespace, name) of the custom tools: their calls are custom_tool_call
        self._seal = seal  # reasoning items carry encrypted_content (include: reasoning.encrypted_content)
        self._max_tool_calls = max_tool_calls
        self._hosted = hosted  # the server-side tools, which say what a server call is
        self._max_server_calls = max_server_calls
        self.server_calls = 0
        self.server_call: ServerCall | None = None  # the server call the output ends with so far, for the tool loop
        self._awaiting: Item | None = None  # a server call written and waiting for its result
        self._summaries = reasoning_summaries  # also send the reasoning as summary events (LangChain, AI SDK)
        self._reasoning_event = reasoning_event  # OpenAI SDK's name, or the Open Responses spec's response.reasoning
        self._items: list[Item] = [Item(index, body, ItemKind.SERVER_CALL) for index, body in enumerate(leading)]
        self._unannounced = list(self._items)  # whole items, no target: written as they are
        self._open: Item | None = None  # None also while a call past max_tool_calls is skipped
        self._arguments = arguments
        self._sealing: tuple[str, ...] = ()  # the open call's encrypted parameters: its deltas wait for its end
        self.tool_calls = 0

    def add(self, events: Iterable[Event | ToolEvent]) -> list[Payload | TextDelta]:
        payloads: list[Payload | TextDelta] = []
        if self._unannounced:
            for item in self._unannounced:
                payloads += [{"type": "response.output_item.added", "output_index": item.index, "item": item.body},
                             {"type": "response.output_item.done", "output_index": item.index, "item": item.body}]
            self._unannounced = []
        pending: list[str] = []  # text for the open item, sent as one delta
        for event in events:
            if type(event) is str:
                if self._open is not None:
                    self._open.pieces.append(event)
                    if not self._sealing:
                        pending.append(event)
                continue
            if pending:
                payloads.append((self._open, "".join(pending)))  # type: ignore[arg-type]
                pending = []
            if isinstance(event, ItemStarted):
                self.server_call = None
                payloads += self._start(event)
            elif isinstance(event, ItemDone):
                if self.server_call is not None:
                    self.server_call.complete = event.complete
                if self._open is not None:
                    payloads += self._finish(self._open, "completed" if event.complete else "incomplete",
                                             event.tokens)
            elif isinstance(event, ToolsListed | ApprovedCall | CallResult):
                payloads += self._tool_event(event)
        if pending:
            payloads.append((self._open, "".join(pending)))  # type: ignore[arg-type]
        return payloads

    def close_open(self) -> list[Payload]:
        """The generation failed: end the open item, incomplete, and a server call still running."""
        payloads = self._finish(self._open, "incomplete") if self._open is not None else []
        if self._awaiting is not None:
            payloads += server_output.cut_off(self._awaiting, was_written=True)
            self._awaiting = None
        return payloads

    @property
    def calling(self) -> bool:
        """A tool call is being written, awaits its result, or ends the model's turn (a client's call: its output
        must follow it): no place to stop a steered response."""
        open_call = self._open is not None and self._open.kind in (ItemKind.TOOL_CALL, ItemKind.SERVER_CALL)
        return open_call or self._awaiting is not None or self.tool_calls > 0

    @property
    def seals(self) -> bool:
        """Reasoning is sealed: the parser must keep reasoning token ids."""
        return self._seal is not None

    def items(self) -> list[dict[str, Any]]:
        """The output items as they stand (an open item with its text so far)."""
        return [self._body(item, item.body.get("status", "in_progress")) for item in self._items]

    # -- one item ----------------------------------------------------------------------------------

    def _start(self, event: ItemStarted) -> list[Payload]:
        kind = event.kind
        if kind is ItemKind.SERVER_CALL:
            return self._start_server_call(event)
        if kind is ItemKind.TOOL_CALL:
            if self._max_tool_calls is not None and self.tool_calls >= self._max_tool_calls:
                return []
            self.tool_calls += 1
            if (event.namespace, event.name) in self._custom_tools:  # raw input; the SDK's type has no status
                body = {"id": self._new_id("ctc_"), "type": "custom_tool_call", "call_id": self._new_id("call_"),
                        "name": event.name or "", "input": ""}
            else:
                body = {"id": self._new_id("fc_"), "type": "function_call", "status": "in_progress",
                        "call_id": self._new_id("call_"), "name": event.name or "", "arguments": ""}
            if event.namespace is not None:  # a member of the client's namespace tool: Codex routes by both
                body["namespace"] = event.namespace
            if self._arguments is not None and body["type"] == "function_call":
                self._sealing = self._arguments.parameters(event.namespace, body["name"])
        elif kind is ItemKind.REASONING:
            body = {"id": self._new_id("rs_"), "type": "reasoning", "status": "in_progress", "summary": [],
                    "content": []}
        else:
            body = {"id": self._new_id("msg_"), "type": "message", "status": "in_progress", "role": "assistant",
                    "phase": "commentary" if kind is ItemKind.PREAMBLE else "final_answer", "content": []}
        item = Item(len(self._items), body, kind)
        item.delta_prefixes = self._delta_prefixes(item)
        self._items.append(item)
        self._open = item
        where = {"item_id": body["id"], "output_index": item.index}
        payloads: list[Payload] = [{"type": "response.output_item.added", "output_index": item.index,
                                    "item": dict(body)}]
        if kind is ItemKind.REASONING:
            payloads.append({"type": "response.content_part.added", **where, "content_index": 0,
                             "part": _part(kind, "")})
            if self._summaries:
                payloads.append({"type": "response.reasoning_summary_part.added", **where, "summary_index": 0,
                                 "part": {"type": "summary_text", "text": ""}})
        elif kind is not ItemKind.TOOL_CALL:
            payloads.append({"type": "response.content_part.added", **where, "content_index": 0,
                             "part": _part(kind, "")})
        return payloads

    def _delta_prefixes(self, item: Item) -> tuple[bytes, ...]:
        if item.kind is ItemKind.SERVER_CALL:
            return tuple(_delta_prefix(fields) for fields in server_output.delta_events(item))
        where = {"item_id": item.body["id"], "output_index": item.index}
        if item.kind is ItemKind.TOOL_CALL:
            kind = "custom_tool_call_input" if _custom(item) else "function_call_arguments"
            return (_delta_prefix({"type": f"response.{kind}.delta", **where}),)
        if item.kind is ItemKind.REASONING:
            prefixes = [_delta_prefix({"type": f"{self._reasoning_event}.delta", **where, "content_index": 0})]
            if self._summaries:
                prefixes.append(_delta_prefix({"type": "response.reasoning_summary_text.delta", **where,
                                               "summary_index": 0}))
            return tuple(prefixes)
        return (_delta_prefix({"type": "response.output_text.delta", **where, "content_index": 0, "logprobs": []}),)

    def _finish(self, item: Item, status: str, tokens: tuple[int, ...] | None = None) -> list[Payload]:
        self._open = None
        sealed: list[Payload] = []
        if self._sealing:
            arguments, names = self._arguments.seal(item.text, self._sealing)  # type: ignore[union-attr]
            item.pieces[:] = [arguments]
            item.body["encrypted_function_args"] = names
            sealed = [(item, arguments)]  # type: ignore[list-item]
            self._sealing = ()
        if item.kind is ItemKind.SERVER_CALL:
            if status != "completed":
                return server_output.cut_off(item, was_written=False)
            if item.index < 0:  # placed in the output only now (server_output.LAZY)
                item.index = len(self._items)
                self._items.append(item)
            self._awaiting = item
            return server_output.written(item)
        if not _custom(item):
            item.body["status"] = status
        if item.kind is ItemKind.REASONING and self._seal is not None:
            item.body["encrypted_content"] = self._seal(tokens, item.text)
        body = self._body(item, status)
        where = {"item_id": body["id"], "output_index": item.index}
        text = item.text
        if item.kind is ItemKind.TOOL_CALL and _custom(item):
            payloads = [{"type": "response.custom_tool_call_input.done", **where, "input": text}]
        elif item.kind is ItemKind.TOOL_CALL:
            payloads = [*sealed, {"type": "response.function_call_arguments.done", **where, "name": body["name"],
                                  "arguments": text}]
        elif item.kind is ItemKind.REASONING:
            payloads = [{"type": f"{self._reasoning_event}.done", **where, "content_index": 0, "text": text},
                        {"type": "response.content_part.done", **where, "content_index": 0,
                         "part": _part(item.kind, text)}]
            if self._summaries:
                payloads += [{"type": "response.reasoning_summary_text.done", **where, "summary_index": 0,
                              "text": text},
                             {"type": "response.reasoning_summary_part.done", **where, "summary_index": 0,
                              "part": {"type": "summary_text", "text": text}}]
        else:
            payloads = [{"type": "response.output_text.done", **where, "content_index": 0, "text": text,
                         "logprobs": []},
                        {"type": "response.content_part.done", **where, "content_index": 0,
                         "part": _part(item.kind, text)}]
        payloads.append({"type": "response.output_item.done", "output_index": item.index, "item": body})
        return payloads

    def _body(self, item: Item, status: str) -> dict[str, Any]:
        if item.kind is ItemKind.SERVER_CALL:
            return server_output.body(item)
        text = item.text
        if _custom(item):
            return {**item.body, "input": text}
        body = {**item.body, "status": status}
        if item.kind is ItemKind.TOOL_CALL:
            body["arguments"] = text
        elif item.kind is ItemKind.REASONING:
            body["content"] = [_part(item.kind, text)]
            body["summary"] = [{"type": "summary_text", "text": text}] if self._summaries else []
        else:
            body["content"] = [_part(item.kind, text)]
        return body

    # -- tools the server runs ----------------------------------------------------------------------------

    def _start_server_call(self, event: ItemStarted) -> list[Payload]:
        if self._hosted is None:
            return []
        target = self._hosted.target(event.name or "", event.channel)
        if self._max_server_calls is not None and self.server_calls >= self._max_server_calls:
            self.server_call = ServerCall(target, None)  # past the limit: not shown, not run
            return []
        self.server_calls += 1
        body = server_output.initial_body(target, self._new_id, self._hosted.container_id)
        lazy = target.kind in server_output.LAZY
        item = Item(-1 if lazy else len(self._items), body, ItemKind.SERVER_CALL, target)
        if not lazy:
            self._items.append(item)
            item.delta_prefixes = self._delta_prefixes(item)
        self._open = item
        self.server_call = ServerCall(target, item)
        return server_output.started(item)

    def _tool_event(self, event: ToolEvent) -> list[Payload]:
        if isinstance(event, ToolsListed):
            index = len(self._items)
            payloads = server_output.listed_items(event.label, event.tools, self._new_id("mcpl_"), index)
            self._items.append(Item(index, payloads[-1]["item"], ItemKind.SERVER_CALL))  # no target: whole
            return payloads
        if isinstance(event, ApprovedCall):
            self.server_calls += 1
            body = server_output.initial_body(event.target, self._new_id, "")
            body["approval_request_id"] = event.approval_request_id
            item = Item(len(self._items), body, ItemKind.SERVER_CALL, event.target)
            item.pieces.append(event.arguments)
            self._items.append(item)
            self._awaiting = item
            return server_output.approved(item)
        item, self._awaiting = self._awaiting, None
        if item is None:
            return []
        include = self._hosted is not None and self._hosted.include_outputs
        return server_output.finished(item, event.output, include)


def _custom(item: Item) -> bool:
    return item.body["type"] == "custom_tool_call"


def _part(kind: ItemKind, text: str) -> dict[str, Any]:
    if kind is ItemKind.REASONING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _delta_prefix(fields: dict[str, Any]) -> bytes:
    """A delta event's SSE frame up to its text: `event: T\ndata: {...,"delta":`."""
    head = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))[:-1]
    return f'event: {fields["type"]}\ndata: {head},"delta":'.encode()
