"""The Responses API: create, retrieve, delete, list input items, cancel."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.disconnect import unless_disconnected
from proxy.errors import APIError, invalid_request
from proxy.generation import Outcome, parsed_events
from proxy.ids import new_id
from proxy.options import generation_request
from proxy.responses.frames import EventWriter
from proxy.responses.output import ResponseOutput
from proxy.responses.request import prompt_for, read_responses_request, resolve
from proxy.responses.run import ResponseRun
from proxy.responses.store import UNFINISHED, StoredResponse
from proxy.sse import EventStream
from proxy.state import ServerState


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    config = state.config
    parsed = await read_responses_request(
        request, config.default_reasoning_effort, config.served_model_name, state.renderer.tools
    )
    state.check_model(parsed.model)
    if parsed.background and state.responses is None:
        raise invalid_request("Background responses need storage, which this server has off (--no-store).",
                              param="background")
    state.require_ready()
    history, items = await resolve(parsed, state.responses)
    response_id = new_id("resp_")
    engine_request = generation_request(
        response_id,
        await state.renderer.render_off_loop(prompt_for(parsed, history, items)),
        parsed.options,
        parsed.constraint(),
        state.vocab,
        config.max_model_len,
        prompt_param="input",
        max_tokens_param="max_output_tokens",
    )
    outcome = Outcome(prompt_tokens=len(engine_request.prompt_token_ids))
    output = ResponseOutput(
        new_id,
        parsed.max_tool_calls,
        reasoning_summaries=config.reasoning_summary_events,
        reasoning_event="response.reasoning" if config.open_responses_events else "response.reasoning_text",
    )
    stored = parsed.store and state.responses is not None
    run = ResponseRun(response_id, parsed, items, output, outcome,
                      parsed_events(state.engine, engine_request, state.vocab, outcome), stored)
    if parsed.background:
        await state.responses.save(run.record())  # queued; `background` requires store, checked above
        state.jobs.start(run)
        return JSONResponse(run.resource())
    await unless_disconnected(request, run.start())
    if parsed.stream:
        return EventStream(_frames(run, state))
    final = await unless_disconnected(request, _complete(run))
    if stored:
        await state.responses.save(run.record())
    return JSONResponse(final)


async def retrieve_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    if request.query_params.get("stream") in ("true", "1"):
        raise invalid_request("Streaming a stored response is not supported; GET it without `stream`.", param="stream")
    response_id = request.path_params["response_id"]
    running = state.jobs.get(response_id) if state.jobs else None
    if running is not None:
        return JSONResponse(running.resource())
    return JSONResponse((await _stored(state, response_id)).resource)


async def delete_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    response_id = request.path_params["response_id"]
    record = await _stored(state, response_id)
    if state.jobs and record.resource["status"] in UNFINISHED:
        await state.jobs.cancel(response_id)  # in whichever process runs it, so that it stops writing
    await state.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    record = await _stored(state, request.path_params["response_id"])
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("`order` must be 'asc' or 'desc'.", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise invalid_request("`limit` must be an integer from 1 to 100.", param="limit")
    items = record.input_items if order == "asc" else record.input_items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid_request(f"No input item with id '{after}' in this response.", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResponse({
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    })


async def cancel_response(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    response_id = request.path_params["response_id"]
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


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


async def _complete(run: ResponseRun) -> dict[str, Any]:
    async for payload in run.events():
        last = payload
    return last["response"]


async def _frames(run: ResponseRun, state: ServerState) -> AsyncGenerator[bytes, None]:
    writer = EventWriter()
    async for batch in run.batches():
        yield writer.frames(batch)
    if run.request.store and state.responses is not None:
        await state.responses.save(run.record())
