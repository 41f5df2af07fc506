"""The JSON Schema of the Responses requests we accept, and of each kind of input item."""

from __future__ import annotations

from typing import Any

_NULLABLE_BOOL = {"type": ["boolean", "null"]}
_STRING = {"type": "string"}


def _object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


# Text parts are checked here; other part types are refused by request.py with a clearer message.
_PART = {"type": "object", "required": ["type"],
         "properties": {"type": _STRING, "text": _STRING, "refusal": _STRING}}
_STATUS = {"enum": ["in_progress", "completed", "incomplete", None]}

ITEMS: dict[str, dict[str, Any]] = {
    "message": _object(["role", "content"], {
        "type": {"const": "message"},
        "id": _STRING,
        "role": {"enum": ["user", "system", "developer", "assistant"]},
        "content": {"anyOf": [_STRING, {"type": "array", "items": _PART}]},
        "status": _STATUS,
        "phase": {"enum": ["commentary", "final_answer", None]},
    }),
    "reasoning": _object(["summary"], {
        "type": {"const": "reasoning"},
        "id": _STRING,
        "summary": {"type": "array", "items": _object(["type", "text"], {"type": {"const": "summary_text"},
                                                                        "text": _STRING})},
        "content": {"anyOf": [{"type": "null"}, {"type": "array", "items": _object(
            ["type", "text"], {"type": {"const": "reasoning_text"}, "text": _STRING})}]},
        "encrypted_content": {"type": ["string", "null"]},
        "status": _STATUS,
    }),
    "function_call": _object(["call_id", "name", "arguments"], {
        "type": {"const": "function_call"},
        "id": _STRING,
        "call_id": {"type": "string", "minLength": 1},
        "name": _STRING,
        "arguments": _STRING,
        "status": _STATUS,
    }),
    "function_call_output": _object(["call_id", "output"], {
        "type": {"const": "function_call_output"},
        "id": _STRING,
        "call_id": {"type": "string", "minLength": 1},
        "output": {"anyOf": [_STRING, {"type": "array", "items": _PART}]},
        "status": _STATUS,
    }),
    "item_reference": _object(["id"], {"type": {"const": "item_reference"}, "id": _STRING}),
}

_FORMAT = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "name": _STRING,
        "description": {"type": ["string", "null"]},
        "schema": {"type": "object"},
        "strict": _NULLABLE_BOOL,
    },
    "additionalProperties": False,
}

RESPONSES_REQUEST: dict[str, Any] = _object([], {
    "model": _STRING,
    "input": {"anyOf": [_STRING, {"type": "array", "items": {"type": "object"}}]},
    "instructions": {"type": ["string", "null"]},
    "tools": {"type": ["array", "null"], "items": _object(["type", "name"], {
        "type": {"const": "function"},
        "name": _STRING,
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"]},
        "strict": _NULLABLE_BOOL,
    })},
    "tool_choice": {"anyOf": [
        {"enum": ["none", "auto", "required", None]},
        _object(["type", "name"], {"type": {"const": "function"}, "name": _STRING}),
    ]},
    "parallel_tool_calls": _NULLABLE_BOOL,
    "max_tool_calls": {"type": ["integer", "null"], "minimum": 1},
    "reasoning": {"type": ["object", "null"], "properties": {
        "effort": {"enum": ["low", "medium", "high", None]},
        "summary": {"enum": ["auto", "concise", "detailed", None]},
        "generate_summary": {"enum": ["auto", "concise", "detailed", None]},
    }, "additionalProperties": False},
    "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "text": {"type": ["object", "null"], "properties": {
        "format": {"anyOf": [{"type": "null"}, _FORMAT]},
        "verbosity": {"enum": ["medium", None]},
    }, "additionalProperties": False},
    "metadata": {"type": ["object", "null"], "maxProperties": 16, "additionalProperties": _STRING},
    "store": _NULLABLE_BOOL,
    "previous_response_id": {"type": ["string", "null"]},
    "stream": _NULLABLE_BOOL,
    "stream_options": {"type": ["object", "null"], "properties": {"include_obfuscation": {"type": "boolean"}},
                       "additionalProperties": False},
    "background": _NULLABLE_BOOL,
    "truncation": {"enum": ["disabled", None]},
    "include": {"type": ["array", "null"], "items": {"const": "reasoning.encrypted_content"}},
    "user": {"type": ["string", "null"]},
    "safety_identifier": {"type": ["string", "null"]},
    "prompt_cache_key": {"type": ["string", "null"]},
    "service_tier": {"type": ["string", "null"]},
    "top_logprobs": {"enum": [0, None]},
    "presence_penalty": {"enum": [0, None]},
    "frequency_penalty": {"enum": [0, None]},
})

# Fields the Responses API documents that this server cannot honour: a 400 that says why.
UNSUPPORTED = {
    "prompt": "reusable prompt templates are not supported; send `instructions` and `input`",
    "conversation": "conversation objects are not supported; use `previous_response_id`",
    "context_management": "server-side context management is not supported",
}
