"""The response object: every field of the Open Responses resource, present even when null."""

from __future__ import annotations

from typing import Any

from proxy.engines.base import Usage
from proxy.responses.request.parse import ResponsesRequest

# The engine's sampling defaults (gpt-oss's generation config), reported when a request sets none.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


def response_object(
    request: ResponsesRequest,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    *,
    stored: bool,
    usage: Usage | None = None,
    reasoning_tokens: int = 0,
    error: dict[str, str] | None = None,
    completed_at: int | None = None,
    incomplete_reason: str = "max_output_tokens",
) -> dict[str, Any]:
    body = request.body
    reasoning = body.get("reasoning") or {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "incomplete_details": {"reason": incomplete_reason} if status == "incomplete" else None,
        "model": request.model,
        "previous_response_id": body.get("previous_response_id"),
        "conversation": {"id": request.conversation} if request.conversation is not None else None,
        "instructions": body.get("instructions"),
        "output": output,
        "error": error,
        "tools": [
            *request.tool_echo,  # the client's own tools
            *request.hosted.echo,  # server-side tools, header values and tokens redacted
        ],
        "tool_choice": _tool_choice(request),
        "truncation": "disabled",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "text": {"format": request.text_format, "verbosity": request.verbosity or "medium"},  # those in effect
        "top_p": body["top_p"] if body.get("top_p") is not None else DEFAULT_TOP_P,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "temperature": body["temperature"] if body.get("temperature") is not None else DEFAULT_TEMPERATURE,
        "reasoning": {"effort": request.effort_name or request.effort,  # as asked; the Harmony level renders
                      "summary": reasoning.get("summary") or reasoning.get("generate_summary"),
                      # Asked for: the mode used, which is gpt-oss's own (earlier turns' reasoning is not shown).
                      **({"context": "current_turn"} if reasoning.get("context") else {})},
        "usage": usage_object(usage, reasoning_tokens) if usage is not None else None,
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "store": stored,
        "background": request.background,
        "service_tier": "default",  # the tier actually used, whatever was asked (the spec allows them to differ)
        "metadata": body.get("metadata") or {},
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "user": body.get("user"),
    }


def _tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    return {"type": choice.mode, "name": choice.name} if choice.names_tool else choice.mode


def usage_object(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        # Nothing is written to a cache on request (prompt caching here is the engine's own prefix cache); the
        # field is required by the spec and by openai-python's types.
        "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
