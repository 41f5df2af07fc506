"""`POST /v1/responses/input_tokens`: how many prompt tokens a Responses request would have, from the renderer.

The body is a create request's (checked the same way, `previous_response_id` and item references resolved,
server-side tools listed so their declarations count); nothing is generated, so the engine need not be ready.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.responses.hosted import offered_builtins
from proxy.responses.hosted import resolve as resolve_hosted
from proxy.responses.request.parse import ResponsesRequest, prompt_for, read_responses_request, resolve
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.sessions import McpSessions
from proxy.state import ServerState


async def count_input_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    parsed, history, items = await read_resolved(request, state)
    prompt = await rendered_prompt(state, parsed, history, items)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(prompt)})


async def read_resolved(request: Request, state: ServerState, model_required: bool = False
                        ) -> tuple[ResponsesRequest, list[dict[str, Any]], list[dict[str, Any]]]:
    """A Responses body that generates nothing yet (counted, compacted): read, its model (the served one when
    absent, unless `model_required`) and built-in tools checked, its history and item references looked up."""
    config = state.config
    default_model = None if model_required else config.served_model_name
    parsed = await read_responses_request(
        request, config.default_reasoning_effort, default_model, state.renderer.tools)
    state.check_model(parsed.model)
    parsed.hosted = await offered_builtins(parsed.hosted, state.tool_servers)
    history, items = await resolve(parsed, state.responses)
    return parsed, history, items


async def rendered_prompt(state: ServerState, parsed: ResponsesRequest, history: list[dict[str, Any]],
                          items: list[dict[str, Any]]) -> list[int]:
    """The prompt the request's first generation would have, server-side tools declared."""
    prompt = await prompt_for(parsed, history, items, state.unsealer())
    if parsed.hosted:
        sessions = McpSessions(McpLimits(call_timeout=state.config.tool_call_timeout), state.mcp_allow)
        try:
            hosted = await resolve_hosted(parsed.hosted, state.mcp_allow, state.tool_servers, state.mcp_tool_lists,
                                          sessions, history + items, parsed.body.get("include") or [])
        finally:
            await sessions.aclose()
        if parsed.tool_choice.mode == "none":
            hosted.offer_none()
        prompt.builtin_tools, prompt.namespaces = tuple(sorted(hosted.builtin)), hosted.namespaces
    return await state.renderer.render_off_loop(prompt)
