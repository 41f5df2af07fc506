"""Validation of our Responses bodies and events against the Open Responses models (openresponses-types).

Two documented exceptions, both differences of the spec package from what OpenAI's own SDK uses:
- Raw reasoning events: the spec names them `response.reasoning.delta`/`.done`; the openai SDK (and so this
  server by default) `response.reasoning_text.delta`/`.done`. With `--open-responses-events` the server uses the
  spec's names and no renaming is needed.
- `text.format` of type `json_schema`: openresponses-types 2.4 types its `schema` field as `None`, so any real
  schema fails; such a format is checked against the spec's documented fields instead.
"""

from __future__ import annotations

from typing import Any

import openresponses_types as spec

EVENTS = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.queued": spec.ResponseQueuedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.failed": spec.ResponseFailedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.reasoning.delta": spec.ResponseReasoningDeltaStreamingEvent,
    "response.reasoning.done": spec.ResponseReasoningDoneStreamingEvent,
    "response.reasoning_summary_part.added": spec.ResponseReasoningSummaryPartAddedStreamingEvent,
    "response.reasoning_summary_part.done": spec.ResponseReasoningSummaryPartDoneStreamingEvent,
    "response.reasoning_summary_text.delta": spec.ResponseReasoningSummaryDeltaStreamingEvent,
    "response.reasoning_summary_text.done": spec.ResponseReasoningSummaryDoneStreamingEvent,
    "response.function_call_arguments.delta": spec.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
}
OPENAI_NAMES = {"response.reasoning_text.delta": "response.reasoning.delta",
                "response.reasoning_text.done": "response.reasoning.done"}


def validate_resource(body: dict[str, Any]) -> None:
    text_format = body["text"]["format"]
    if text_format["type"] == "json_schema":  # exception 2: check the documented fields, then validate the rest
        assert isinstance(text_format["name"], str) and isinstance(text_format["schema"], dict)
        body = {**body, "text": {**body["text"], "format": {"type": "text"}}}
    spec.ResponseResource.model_validate(body)


def validate_event(event: dict[str, Any], spec_names: bool = False) -> None:
    kind = event["type"]
    if not spec_names:
        kind = OPENAI_NAMES.get(kind, kind)  # exception 1
    assert kind in EVENTS, f"not an Open Responses event: {event['type']}"
    if "response" in event:
        validate_resource(event["response"])
        event = {**event, "response": {**event["response"], "text": {"format": {"type": "text"}}}}
    EVENTS[kind].model_validate({**event, "type": kind})
