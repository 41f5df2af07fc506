"""Compaction by gpt-oss itself: the loaded model summarizes the conversation, and the summary, sealed, becomes a
`compaction` item that stands for it in later input (proxy/responses/compaction_items.py).

Three ways in, as OpenAI and Codex have them:
- `POST /v1/responses/compact`: stateless; answers `object: "response.compaction"` with the conversation's user
  messages and one compaction item;
- `context_management: [{"type": "compaction", "compact_threshold": N}]` on create: when the rendered input is
  over N tokens, compact first, then answer from the compacted input; the compaction item comes first in the
  output;
- a terminal `{"type": "compaction_trigger"}` input item (Codex): the response is the compaction item alone.

The summary is one generation on the engine: the conversation rendered as for an answer (same system message and
tools, so the engine's prefix cache serves it), then a user message asking for the summary (`INSTRUCTION`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from parsers.events import ItemKind
from parsers.items import ItemCollector
from proxy.disconnect import unless_disconnected
from proxy.engines.base import OutputConstraint
from proxy.errors import APIError
from proxy.generation import parsed_events
from proxy.ids import new_id
from proxy.options import generation_request
from proxy.outcome import Outcome
from proxy.responses.compaction_items import compaction_item, kept_before_compaction, retained_messages, split_trigger
from proxy.responses.input_tokens import read_resolved, rendered_prompt
from proxy.responses.output.resource import usage_object
from proxy.responses.request.parse import ResponsesRequest
from proxy.state import ServerState
from tools.definitions import ToolChoice

INSTRUCTION = (
    "Compact our conversation: write the summary you will continue from, in place of everything above except my "
    "messages. Keep what you need to go on without them:\n"
    "- the task: my goal, requirements and constraints, and what done looks like;\n"
    "- decisions made, and why;\n"
    "- files read, created or changed (paths, and what changed), and commands run with their outcome;\n"
    "- tool results still needed, exactly (values, identifiers, error messages);\n"
    "- open threads: what is unfinished, failing or unverified, and the next steps.\n"
    "Leave out what no longer matters. Write terse notes, not prose. Do not call tools."
)
SUMMARY_MAX_TOKENS = 4096
MIN_SUMMARY_TOKENS = 1024  # room left for the summary (a quarter of the context window, if that is less)
TRIM_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_THRESHOLD_SHARE = 0.8  # of the context window, when `compact_threshold` is null

logger = logging.getLogger("harmony_proxy")


async def summarize(state: ServerState, parsed: ResponsesRequest, history: list[dict[str, Any]],
                    items: list[dict[str, Any]]) -> tuple[str, Outcome]:
    """gpt-oss's summary of the conversation (history then items), and the generation's outcome."""
    ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": INSTRUCTION}]}
    window = state.config.max_model_len
    room = min(MIN_SUMMARY_TOKENS, window // 4)  # what the summary needs at least
    conversation = [*history, *items]
    for share in TRIM_SHARES:  # a conversation too long to summarize whole loses its oldest work first
        kept = _trimmed(conversation, share)
        prompt = await rendered_prompt(state, parsed, [], [*kept, ask])
        if len(prompt) + room <= window:
            break
    if share:
        logger.warning("compaction: the conversation did not fit the context with room for a summary; its oldest "
                       "%d%% of tool calls, outputs and answers were left out of the summary's prompt", share * 100)
    options = replace(parsed.options, max_tokens=max(1, min(SUMMARY_MAX_TOKENS, window - len(prompt))))
    request = generation_request(new_id("cmp_"), prompt, options, OutputConstraint((), ToolChoice("none")),
                                 state.vocab, window, prompt_param="input")
    outcome = Outcome(prompt_tokens=len(prompt))
    collector = ItemCollector()
    async with contextlib.aclosing(parsed_events(state.engine, request, state.vocab, outcome)) as events:
        async for batch in events:
            collector.add(batch)
    failure = outcome.failure()
    if failure is not None:
        raise failure
    # The answer; a model that only thought (or was cut off thinking) still summarized in its thoughts.
    for kinds in ((ItemKind.FINAL,), (ItemKind.PREAMBLE,), (ItemKind.REASONING,)):
        text = "\n\n".join(item.text for item in collector.items if item.kind in kinds and item.text.strip())
        if text:
            return text.strip(), outcome
    return "", outcome


def _trimmed(conversation: list[dict[str, Any]], share: float) -> list[dict[str, Any]]:
    """The conversation without the oldest `share` of its items, but for messages from the user, instructions
    and compaction items; an output goes with its call."""
    cut = int(len(conversation) * share)
    if not cut:
        return conversation
    dropped = {item["call_id"] for item in conversation[:cut] if item["type"] == "function_call"}
    return [item for position, item in enumerate(conversation)
            if (position >= cut or kept_before_compaction(item) or item["type"] == "compaction")
            and not (item["type"] == "function_call_output" and item["call_id"] in dropped)]


@dataclass
class Compacted:
    """What `compact_first` did: the compaction item and the summary's outcome, or the prompt it rendered to
    decide not to compact (the response's own, when no server-side tools change it)."""

    item: dict[str, Any] | None = None
    outcome: Outcome | None = None
    prompt: list[int] | None = None


def threshold(parsed: ResponsesRequest, max_model_len: int) -> int | None:
    """The rendered input size past which a create request compacts first, or None."""
    for entry in parsed.body.get("context_management") or []:
        if entry.get("type") == "compaction":
            limit = entry.get("compact_threshold")
            return limit if limit is not None else int(max_model_len * DEFAULT_THRESHOLD_SHARE)
    return None


async def compact_first(state: ServerState, parsed: ResponsesRequest, history: list[dict[str, Any]],
                        items: list[dict[str, Any]], triggered: bool, prompt: list[int] | None = None) -> Compacted:
    """Before a create request generates: whether to compact, and if so the compaction. A compaction_trigger
    always compacts; `context_management` does past its threshold. `prompt`: the request's rendered prompt, when
    the caller has it (a WebSocket continuation)."""
    limit = threshold(parsed, state.config.max_model_len)
    if not triggered:
        if limit is None:
            return Compacted()
        if prompt is None:
            prompt = await rendered_prompt(state, parsed, history, items)
        if len(prompt) <= limit:
            return Compacted(prompt=prompt)
    summary, outcome = await summarize(state, parsed, history, items)
    return Compacted(compaction_item(state.sealer, summary), outcome)


async def compact_response(request: Request) -> Response:
    """`POST /v1/responses/compact`: stateless, nothing stored."""
    state: ServerState = request.app.state.harmony
    parsed, history, items = await read_resolved(request, state, model_required=True)  # as OpenAI
    state.require_ready()
    items, _ = split_trigger(items)
    if not history and not items:
        raise APIError(400, "There is nothing to compact: send `input` or `previous_response_id`.", param="input")
    summary, outcome = await unless_disconnected(request, summarize(state, parsed, history, items))
    output = [*retained_messages(history + items), compaction_item(state.sealer, summary)]
    return JSONResponse({"id": new_id("resp_"), "object": "response.compaction", "created_at": int(time.time()),
                         "output": output, "usage": usage_object(outcome.usage, outcome.reasoning_tokens)})
