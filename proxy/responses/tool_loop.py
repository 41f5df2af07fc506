"""The server-side tool loop of one response: generate; when the completion ends in a call to a tool this server
runs (an MCP server's, gpt-oss's browser or python), run it, add the call and its result to the prompt, and
generate again, until the model answers, calls a client function, or asks for an approval, or a limit stops it.

- The next prompt is the last one, then the tokens the model generated (its reasoning and its call, exactly as
  written: Harmony keeps reasoning within a tool loop), the tool's answer as a Harmony tool message
  (`proxy/server_tools/rendering.py`) and `<|start|>assistant`. Nothing is rendered again, and an engine's prefix
  cache serves everything but the new tokens.
- Usage adds up over the generations: input tokens are each generation's whole prompt (as vLLM counts them), so a
  prefix read again counts again; `cached_tokens` says how much of that the engine's prefix cache served, when
  the engine reports it.
- Limits: `max_output_tokens` across all generations; `max_tool_calls` and the server's `--max-tool-calls` on the
  calls run: a call past them is not run, the model is told so and generates once more, and a second such call
  ends the response; the per-call timeout is the MCP sessions' (`--tool-call-timeout`).
- Cancelling (a client that leaves, a background response cancelled) cancels this generator where it waits: the
  engine request is aborted, or the tool call is cancelled and the MCP sessions closed, which tells the server.

The events are the parser's, and `ToolEvent`s (`proxy/responses/output/server_output.py`) for the output fold; the fold
says which call the completion ended with (`ResponseOutput.server_call`), having seen every event first.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from parsers.events import Event
from parsers.vocab import Vocab
from proxy.engines.base import Engine, EngineError, GenerationRequest, OutputConstraint
from proxy.errors import APIError
from proxy.generation import parsed_events
from proxy.options import GenerationOptions, generation_request
from proxy.outcome import Outcome
from proxy.responses.hosted import APPROVAL, CODE, MCP, CallTarget, HostedTools
from proxy.responses.output.fold import ResponseOutput
from proxy.responses.output.server_items import PendingApproval
from proxy.responses.output.server_output import ApprovedCall, CallResult, ToolEvent, ToolsListed
from proxy.server_tools.connect import McpServerError
from proxy.server_tools.headers import ServerHeaders
from proxy.server_tools.output import ToolOutput
from proxy.server_tools.rendering import result_tokens
from proxy.server_tools.sessions import McpSessions
from proxy.telemetry.request_record import current_record
from proxy.telemetry.tracing import stage

Render = Callable[[list[dict[str, Any]]], Awaitable[list[int]]]  # the prompt, with these items added to the input


class ToolLoop:
    def __init__(self, engine: Engine, vocab: Vocab, hosted: HostedTools, sessions: McpSessions,
                 output: ResponseOutput, response_id: str, options: GenerationOptions, constraint: OutputConstraint,
                 max_model_len: int) -> None:
        self._engine, self._vocab, self._hosted, self._sessions = engine, vocab, hosted, sessions
        self._output, self._response_id, self._options, self._constraint = output, response_id, options, constraint
        self._max_model_len = max_model_len
        self._open_assistant = [vocab.special.start, *vocab.encode("assistant")]
        self.outcome = Outcome(prompt_tokens=0)  # the response's, over all its generations

    async def events(self, first: GenerationRequest | None, render: Render,
                     approvals: list[PendingApproval]) -> AsyncGenerator[list[Event | ToolEvent], None]:
        """The loop's events. `first` is the first generation, checked already; None when `approvals` run first,
        after which `render` gives the prompt (with the calls they ran)."""
        prefix: list[Event | ToolEvent] = [ToolsListed(label, tools) for label, tools in self._hosted.listed]
        try:
            if first is None:
                ran = []
                for approval in approvals:
                    target = self._hosted.mcp_target(approval.label, approval.name)
                    yield [*prefix, ApprovedCall(target, approval.arguments, approval.request_id)]
                    prefix = []
                    result = await self._run(target, approval.arguments)
                    yield [CallResult(result)]
                    ran.append(_ran_item(approval, result))
                try:
                    prompt = await render(ran)
                except APIError as exc:  # the stream has started: the response fails, as it would later
                    raise EngineError(exc.message, status=exc.status, code=exc.code) from None
                first = self._request(prompt, 0)
            request: GenerationRequest | None = first
            refused = 0
            for iteration in itertools.count(1):
                if request is None:  # max_output_tokens spent
                    self.outcome.finish_reason = "length"
                    return
                generated: list[int] = []
                self._output.server_call = None  # the fold sets it if this completion ends in a server call
                async with contextlib.aclosing(self._generate(request, generated)) as steps:
                    async for events in steps:
                        yield [*prefix, *events] if prefix else events
                        prefix = []
                call = self._output.server_call
                if self.outcome.finish_reason != "stop" or call is None or not call.complete:
                    return
                if call.target.kind == APPROVAL:
                    return  # the response ends with the approval request
                if call.item is None:  # past the limit on tool calls: not run
                    refused += 1
                    if refused > 1:
                        return
                    result = ToolOutput("No more tool calls can run in this response (its limit on tool calls is "
                                        "reached): answer with what you have.", failed=True)
                else:
                    result = await self._run(call.target, call.arguments)
                    yield [CallResult(result)]
                prompt = [*request.prompt_token_ids, *generated, *self._result(call.target, result.text),
                          *self._open_assistant]
                request = self._request(prompt, iteration)
        finally:
            record = current_record.get()
            if record is not None:
                record.outcome, record.response_id = self.outcome, self._response_id
            await self._sessions.aclose()

    async def _generate(self, request: GenerationRequest, generated: list[int]) -> AsyncGenerator[list[Event], None]:
        """One generation's events; its tokens are added to `generated`, its usage to the response's."""
        outcome = Outcome(prompt_tokens=len(request.prompt_token_ids))
        try:
            async with contextlib.aclosing(parsed_events(self._engine, request, self._vocab, outcome,
                                                         self._hosted.recipients, generated,
                                                         self._output.seals)) as events:
                async for step_events in events:
                    yield step_events
        finally:
            self._add(outcome)

    def _add(self, outcome: Outcome) -> None:
        total = self.outcome
        total.prompt_tokens += outcome.prompt_tokens
        total.completion_tokens += outcome.completion_tokens
        total.reasoning_tokens += outcome.reasoning_tokens
        if outcome.cached_tokens is not None:
            total.cached_tokens = (total.cached_tokens or 0) + outcome.cached_tokens
        total.finish_reason = outcome.finish_reason

    def _request(self, prompt: list[int], iteration: int) -> GenerationRequest | None:
        """The next generation, with what is left of `max_output_tokens`; None when nothing is. A prompt the
        context no longer holds fails the response (its output so far stands)."""
        options = self._options
        if options.max_tokens is not None:
            left = options.max_tokens - self.outcome.completion_tokens
            if left <= 0:
                return None
            options = replace(options, max_tokens=left)
        request_id = self._response_id if iteration == 0 else f"{self._response_id}-{iteration}"
        try:
            return generation_request(request_id, prompt, options, self._constraint, self._vocab, self._max_model_len,
                                      prompt_param="input", max_tokens_param="max_output_tokens")
        except APIError as exc:
            raise EngineError(f"The tool loop stopped: {exc.message}", status=exc.status, code=exc.code) from None

    def _result(self, target: CallTarget, text: str) -> list[int]:
        """A tool's answer: from the recipient the model addressed, on commentary for an MCP tool (as function
        results are) and on the call's own channel for a built-in tool (gpt-oss's tools answer so)."""
        channel = "commentary" if target.kind in (MCP, APPROVAL) else target.channel
        return result_tokens(self._vocab, target.recipient, channel, text)

    async def _run(self, target: CallTarget, arguments: str) -> ToolOutput:
        """Run a call; whatever goes wrong is a failed output the model is told about."""
        with stage("tool", {"gen_ai.tool.name": target.tool or "", "harmony_proxy.tool.kind": target.kind}) as span:
            result = await self._call(target, arguments)
            if span is not None and result.failed:
                span.set_attribute("harmony_proxy.tool.failed", True)
            return result

    async def _call(self, target: CallTarget, arguments: str) -> ToolOutput:
        if target.tool is None:
            return ToolOutput(f"There is no tool {target.recipient!r} here: call only the tools you were given.",
                              failed=True)
        if target.server is not None:
            url, headers = target.server.url, target.server.headers
        else:
            assert target.builtin is not None
            url, headers = target.builtin.url, ServerHeaders()
        try:
            session = await self._sessions.get(url, headers)
        except McpServerError as exc:
            return ToolOutput(str(exc), failed=True)
        if target.kind == CODE and target.builtin is not None:
            return await session.call_tool(target.tool, {target.builtin.code_argument: arguments})
        return await session.call_tool_json(target.tool, arguments)


def _ran_item(approval: PendingApproval, result: ToolOutput) -> dict[str, Any]:
    """The approved call as an input item, so that the prompt shows it with its result."""
    item: dict[str, Any] = {"type": "mcp_call", "server_label": approval.label, "name": approval.name,
                            "arguments": approval.arguments, "approval_request_id": approval.request_id}
    if result.failed:
        item["error"] = result.text
    else:
        item["output"] = result.text
    return item
