"""The Responses API: create, retrieve (a background response's events too: resume.py), delete, list input items,
cancel."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.disconnect import unless_disconnected
from proxy.engines.base import GenerationRequest
from proxy.errors import APIError, invalid_request
from proxy.generation import parsed_events
from proxy.ids import checked_id, new_id
from proxy.options import generation_request, routing_hints
from proxy.outcome import Outcome
from proxy.responses.agent_messages import ArgumentSealer
from proxy.responses.compaction import compact_first
from proxy.responses.compaction_items import split_trigger
from proxy.responses.hosted import HostedTools, offered_builtins
from proxy.responses.hosted import resolve as resolve_hosted
from proxy.responses.output.fold import ResponseOutput
from proxy.responses.output.server_items import pending_approvals
from proxy.responses.request.pages import page, page_query
from proxy.responses.request.parse import (
    ResponsesRequest,
    offer_earlier_tools,
    prompt_for,
    read_responses_request,
    resolve,
)
from proxy.responses.run import ResponseRun, RunEvents, Save
from proxy.responses.tool_loop import ToolLoop
from proxy.responses.transport.frames import EventWriter
from proxy.responses.transport.resume import resumed_frames, starting_after
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.sessions import McpSessions
from proxy.sse import EventStream
from proxy.state import ServerState
from proxy.store.base import UNFINISHED, StoredResponse
from proxy.telemetry.request_record import current_record


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    state.check_room()  # a 429 before the body is parsed
    config = state.config
    parsed = await read_responses_request(
        request, config.default_reasoning_effort, config.served_model_name, state.renderer.tools
    )
    await check_create(state, parsed)
    history, items = await resolve(parsed, state.responses)
    offer_earlier_tools(parsed, history, items, state.renderer.tools)
    if parsed.prewarm:
        run = await prewarm_run(state, parsed, history, items)
    else:
        run = await new_run(state, parsed, history, items, request.headers, watch=request)
    if parsed.background:  # `background` requires a store, checked above; the job's process owns the record
        await state.responses.save(run.record())  # queued
        state.jobs.start(run)
        return JSONResponse(run.resource())
    await unless_disconnected(request, run.start())
    if parsed.stream:
        return EventStream(_frames(run))
    return JSONResponse(await unless_disconnected(request, _complete(run)))  # the run saved it (run.py)


async def check_create(state: ServerState, parsed: ResponsesRequest) -> None:
    """What every transport checks before it resolves and renders: the model, the tools, storage, the engine."""
    state.check_model(parsed.model)
    parsed.hosted = await offered_builtins(parsed.hosted, state.tool_servers)
    parsed.hosted.refuse_constraints(parsed.body)
    if parsed.background and state.responses is None:
        raise invalid_request("Background responses need storage, which this server has off (--no-store).",
                              param="background")
    if parsed.conversation is not None and state.responses is None:
        raise invalid_request("Conversations need storage, which this server has off (--no-store).",
                              param="conversation")
    state.require_ready()


async def new_run(state: ServerState, parsed: ResponsesRequest, history: list[dict[str, Any]],
                  items: list[dict[str, Any]], headers: Mapping[str, str], prompt: list[int] | None = None,
                  watch: Request | None = None) -> ResponseRun:
    """A response to generate, for HTTP and WebSocket alike. `prompt`: its tokens, when the caller rendered
    them (a WebSocket continuation); `watch`: the HTTP request whose client leaving cancels the set-up."""
    response_id = new_id("resp_")
    items, triggered = split_trigger(items)
    # Compaction (proxy/responses/compaction.py): the output begins with the compaction item, the prompt ends with it.
    compacting = compact_first(state, parsed, history, items, triggered, prompt)
    compacted = await (unless_disconnected(watch, compacting) if watch is not None else compacting)
    leading = [compacted.item] if compacted.item is not None else []
    if compacted.item is not None:
        prompt = None  # a caller's rendering predates the compaction
    elif prompt is None:
        prompt = compacted.prompt  # rendered to compare with the threshold
    events: RunEvents
    if triggered and compacted.outcome is not None:  # Codex's compaction_trigger: the compaction item is the answer
        output, outcome, events = _output(state, parsed, leading=leading), compacted.outcome, _no_events()
        record = current_record.get()
        if record is not None:  # logs and traces name the response, not the summary's generation
            record.response_id = response_id
    elif parsed.hosted:  # tools this server runs: the tool loop (proxy/responses/tool_loop.py)
        setup = _tool_loop(state, parsed, history, [*items, *leading], response_id, leading)
        output, outcome, events = await (unless_disconnected(watch, setup) if watch is not None else setup)
    else:
        if prompt is None:
            prompt = await state.renderer.render_off_loop(
                await prompt_for(parsed, history, [*items, *leading], state.unsealer()))
        engine_request = _generation(state, parsed, response_id, prompt, _hints(headers, parsed))
        outcome = Outcome(prompt_tokens=len(engine_request.prompt_token_ids))
        output = _output(state, parsed, leading=leading)
        events = parsed_events(state.engine, engine_request, state.vocab, outcome,
                               keep_reasoning_tokens=output.seals)
    return ResponseRun(response_id, parsed, items, output, outcome, events, _save(state, parsed))


async def prewarm_run(state: ServerState, parsed: ResponsesRequest, history: list[dict[str, Any]],
                      items: list[dict[str, Any]], prompt: list[int] | None = None) -> ResponseRun:
    """`generate: false` (WebSocket) or `prompt_cache_options.prewarm`: the prompt rendered (unless the caller
    did: a WebSocket keeps it for the next turn to continue from) and checked as one to generate from, and a
    response completed at once with no output. Instructions alone may be pre-warmed."""
    if prompt is None:
        prompt = await state.renderer.render_off_loop(
            await prompt_for(parsed, history, items, state.unsealer(), generate=False))
    _generation(state, parsed, "prewarm", prompt)  # it fits the context window with the output asked for
    outcome = Outcome(prompt_tokens=len(prompt), finish_reason="stop")
    return ResponseRun(new_id("resp_"), parsed, items, _output(state, parsed), outcome, _no_events(),
                       _save(state, parsed))


def _save(state: ServerState, parsed: ResponsesRequest) -> Save | None:
    """How the run stores itself when finished (run.py): a background job's process owns its record."""
    if state.responses is None or not parsed.store:
        return None
    return state.jobs.save_end if parsed.background and state.jobs else state.responses.save


async def _no_events() -> RunEvents:
    yield []


def _generation(state: ServerState, parsed: ResponsesRequest, response_id: str,
                prompt: list[int], hints: tuple[str, ...] = ()) -> GenerationRequest:
    return generation_request(response_id, prompt, parsed.options, parsed.constraint(), state.vocab,
                              state.config.max_model_len, prompt_param="input", max_tokens_param="max_output_tokens",
                              routing_hints=hints)


def _hints(headers: Mapping[str, str], parsed: ResponsesRequest) -> tuple[str, ...]:
    """Where the conversation went before: the previous response, the conversation, the client's cache key."""
    body = parsed.body
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return routing_hints(headers, body.get("previous_response_id"), conversation, body.get("prompt_cache_key"))


def _output(state: ServerState, parsed: ResponsesRequest, hosted: HostedTools | None = None,
            leading: list[dict[str, Any]] | None = None) -> ResponseOutput:
    config = state.config
    limit = parsed.body.get("max_tool_calls")
    return ResponseOutput(
        new_id,
        parsed.max_tool_calls,
        reasoning_summaries=config.reasoning_summary_events or parsed.summaries,
        reasoning_event="response.reasoning" if config.open_responses_events else "response.reasoning_text",
        hosted=hosted,
        max_server_calls=min(limit, config.max_tool_calls) if limit is not None else config.max_tool_calls,
        seal=state.sealer.seal_reasoning if parsed.sealed_reasoning else None,
        leading=leading or (),
        custom_tools=frozenset((tool.namespace, tool.name) for tool in parsed.tools if tool.freeform is not None),
        arguments=ArgumentSealer(state.sealer, parsed.tools),
    )


async def _tool_loop(state: ServerState, parsed: ResponsesRequest, history: list[dict[str, Any]],
                     items: list[dict[str, Any]], response_id: str,
                     leading: list[dict[str, Any]]) -> tuple[ResponseOutput, Outcome, RunEvents]:
    """Check and list the server-side tools (400, 424), check the first generation (400), and set the loop up.
    Approved calls run first, in the loop, and the prompt is rendered after them."""
    config = state.config
    sessions = McpSessions(McpLimits(call_timeout=config.tool_call_timeout), state.mcp_allow)
    try:
        earlier = history + items
        hosted = await resolve_hosted(parsed.hosted, state.mcp_allow, state.tool_servers, state.mcp_tool_lists,
                                      sessions, earlier, parsed.body.get("include") or [])
        if parsed.tool_choice.mode == "none":
            hosted.offer_none()
        approvals = pending_approvals(earlier)
        output = _output(state, parsed, hosted, leading)
        loop = ToolLoop(state.engine, state.vocab, hosted, sessions, output, response_id, parsed.options,
                        parsed.constraint(), config.max_model_len)

        async def render(ran: list[dict[str, Any]]) -> list[int]:
            prompt = await prompt_for(parsed, history, [*items, *ran], state.unsealer())
            prompt.builtin_tools, prompt.namespaces = tuple(sorted(hosted.builtin)), hosted.namespaces
            return await state.renderer.render_off_loop(prompt)

        first = None if approvals else _generation(state, parsed, response_id, await render([]))
    except BaseException:
        await sessions.aclose()
        raise
    return output, loop.outcome, loop.events(first, render, approvals)


async def retrieve_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    response_id = _response_id(request)
    if request.query_params.get("stream") in ("true", "1"):
        after = starting_after(request.query_params)
        if not (await _stored(state, response_id)).resource.get("background"):
            raise invalid_request("Only background responses can be streamed from a GET; GET it without `stream`.",
                                  param="stream")
        return EventStream(resumed_frames(state.responses, response_id, after))
    running = state.jobs.get(response_id) if state.jobs else None
    if running is not None:
        return JSONResponse(running.resource())
    return JSONResponse((await _stored(state, response_id)).resource)


async def delete_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    response_id = _response_id(request)
    record = await _stored(state, response_id)
    if state.jobs and record.resource["status"] in UNFINISHED:
        await state.jobs.cancel(response_id)  # in whichever process runs it, so that it stops writing
    await state.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    record = await _stored(state, _response_id(request))
    asked = page_query(request.query_params)
    items = record.input_items[::-1] if asked.newest_first else record.input_items
    if asked.after is not None:
        ids = [item["id"] for item in items]
        if asked.after not in ids:
            raise invalid_request(f"No input item with id '{asked.after}' in this response.", param="after")
        items = items[ids.index(asked.after) + 1 :]
    return JSONResponse(page(items[: asked.limit], has_more=len(items) > asked.limit))


async def cancel_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    response_id = _response_id(request)
    record = await _stored(state, response_id)
    if not record.resource.get("background"):
        raise invalid_request("Only background responses can be cancelled.", param="response_id")
    if record.resource["status"] not in UNFINISHED:
        return JSONResponse(record.resource)
    resource = await state.jobs.cancel(response_id)  # in whichever process runs it
    if resource is None:  # deleted meanwhile
        raise _not_found(response_id)
    return JSONResponse(resource)


async def _stored(state: ServerState, response_id: str) -> StoredResponse:
    record = await state.responses.load(response_id) if state.responses is not None else None
    if record is None:
        raise _not_found(response_id)
    return record


def _response_id(request: Request) -> str:
    return checked_id(request.path_params["response_id"], "response_id")


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


async def _complete(run: ResponseRun) -> dict[str, Any]:
    async for payload in run.events():
        last = payload
    return last["response"]


async def _frames(run: ResponseRun) -> AsyncGenerator[bytes, None]:
    writer = EventWriter()
    async for batch in run.batches():  # the run saves itself before its terminal event (run.py)
        yield writer.frames(batch)
