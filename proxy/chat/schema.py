"""The JSON Schema of the Chat Completions requests we accept.

Every field OpenAI documents is either here (and honoured, or harmless to accept), or in UNSUPPORTED with the
reason it is refused. Anything else is "Unrecognized request argument supplied", as OpenAI answers.
tests/test_spec_fields.py sends every field of the installed openai SDK's request types to prove it.
"""

from __future__ import annotations

from typing import Any

from proxy.options import API_EFFORTS
from proxy.validation import METADATA

EFFORT = {"enum": [*API_EFFORTS, None]}  # proxy/options.py maps them
_NULLABLE_BOOL = {"type": ["boolean", "null"]}
# Prompt-caching hints on a content part: the engine's prefix cache needs none, so they are ignored.
_CACHE_HINT = {"type": ["object", "null"]}
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}, "prompt_cache_breakpoint": _CACHE_HINT},
    "additionalProperties": False,
}
_TEXT_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
_ANY_PART = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string"}, "text": {"type": "string"}, "refusal": {"type": "string"}},
}
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "string"},
                "parsed_arguments": {},  # openai-python's parse and stream helpers: `arguments`, decoded
            },
            "additionalProperties": False,
        },
        # Ignored: the call's position in a stream (openai-python's stream helpers keep it), and the AI SDK's
        # Gemini thought signature.
        "index": {"type": ["integer", "null"]},
        "extra_content": {"type": ["object", "null"]},
    },
    "additionalProperties": False,
}

# What SDKs add to the assistant messages they send back: accepted and ignored, since the message's content,
# reasoning and tool calls say everything the prompt needs. openai-python's `model_dump()` of a
# ChatCompletionMessage writes `annotations` (web search citations) and `parsed` (from `.parse()` and the stream
# helpers: the content, decoded); LiteLLM's Message adds `provider_specific_fields`, `thinking_blocks` and
# `reasoning_items` (copies of the reasoning, which is read from `reasoning_content` or `reasoning`).
ASSISTANT_ANNOTATIONS: dict[str, Any] = {
    "annotations": {"type": ["array", "null"]},
    "parsed": {},
    "provider_specific_fields": {"type": ["object", "null"]},
    "thinking_blocks": {"type": ["array", "null"]},
    "reasoning_items": {"type": ["array", "null"]},
}

# Fields of an incoming message accepted only when null (or empty), as SDKs write them; with a value, they would
# put into the conversation something gpt-oss cannot read, so they are a 400 saying why (request.py).
MESSAGE_NULL_ONLY = {
    "audio": "gpt-oss produces text only, so an earlier audio answer cannot be referenced",
    "function_call": "send the call in `tool_calls` instead of the deprecated `function_call`",
    "images": "gpt-oss takes text only",
}


def _message(role: str, required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["role", *required],
        "properties": {"role": {"const": role}, **properties},
        "additionalProperties": False,
    }


MESSAGES = {
    "system": _message("system", ["content"], {"content": _TEXT_CONTENT, "name": {"type": "string"}}),
    "developer": _message("developer", ["content"], {"content": _TEXT_CONTENT, "name": {"type": "string"}}),
    "user": _message(
        "user",
        ["content"],
        {
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _ANY_PART}]},
            "name": {"type": "string"},
        },
    ),
    "assistant": _message(
        "assistant",
        [],
        {
            "content": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "null"},
                    {"type": "array", "items": {**_ANY_PART, "properties": {**_ANY_PART["properties"],
                                                                             "type": {"enum": ["text", "refusal"]}}}},
                ]
            },
            "name": {"type": "string"},
            "refusal": {"type": ["string", "null"]},
            "tool_calls": {"type": ["array", "null"], "items": _TOOL_CALL},
            "reasoning_content": {"type": ["string", "null"]},
            "reasoning": {"type": ["string", "null"]},
            **ASSISTANT_ANNOTATIONS,
            "audio": {"type": ["object", "null"]},
            "function_call": {"type": ["object", "null"]},
            "images": {"type": ["array", "null"]},
        },
    ),
    # `name` (LiteLLM, vLLM's own examples) is ignored: the call's name comes from `tool_call_id`.
    "tool": _message(
        "tool",
        ["content", "tool_call_id"],
        {"content": _TEXT_CONTENT, "tool_call_id": {"type": "string"}, "name": {"type": ["string", "null"]}},
    ),
}

_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": ["string", "null"]},
                "parameters": {"type": ["object", "null"]},
                "strict": {"type": ["boolean", "null"]},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

_RESPONSE_FORMAT = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "json_schema": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "schema": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

_TEMPLATE_ARGS = {"type": ["object", "null"], "properties": {"reasoning_effort": EFFORT}, "additionalProperties": False}

# The spec's tiers. Every request is served the one way this server has, which the response reports as "default"
# (the spec: the tier "actually used", which "may be different from the value set in the parameter").
SERVICE_TIERS = ["auto", "default", "flex", "scale", "priority", "fast"]

# Fields OpenAI documents that this server cannot honour: with a value, a 400 that says why, never a silent drop;
# null is accepted, as SDKs write it.
UNSUPPORTED = {
    "audio": "gpt-oss produces text only",
    "functions": "use `tools` instead of the deprecated `functions`",
    "function_call": "use `tool_choice` instead of the deprecated `function_call`",
    "web_search_options": "built-in web search is not offered; declare a function tool instead",
    "moderation": "no moderation model runs here; moderate input and output in your application",
}

# Tool types of the API other than functions: a 400 naming the type, with the reason.
REFUSED_TOOLS = {"custom": "custom (freeform) tools are served by the Responses API (/v1/responses) here"}

# Neutral values of fields we accept but cannot vary.
NEUTRAL = {
    "frequency_penalty": (0, "frequency penalties are not supported"),
    "presence_penalty": (0, "presence penalties are not supported"),
    "logprobs": (False, "log probabilities are not supported"),
    "top_logprobs": (0, "log probabilities are not supported"),
}

CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {"role": {"enum": sorted(MESSAGES)}},
            },
        },
        "stream": _NULLABLE_BOOL,
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": {"type": "boolean"}, "include_obfuscation": {"type": "boolean"}},
            "additionalProperties": False,
        },
        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},  # 0: greedy (proxy/options.py)
        "seed": {"type": ["integer", "null"]},
        "stop": {
            "anyOf": [
                {"type": "null"},
                {"type": "string", "minLength": 1, "maxLength": 1024},
                {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1, "maxLength": 1024}},
            ]
        },
        "n": {"type": ["integer", "null"], "minimum": 1},
        "ignore_eos": _NULLABLE_BOOL,
        "min_tokens": {"type": ["integer", "null"], "minimum": 0},
        "tools": {"type": ["array", "null"], "items": _TOOL},
        "tool_choice": {
            "anyOf": [
                {"enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"const": "function"},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}},
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
            ]
        },
        "parallel_tool_calls": _NULLABLE_BOOL,
        "reasoning_effort": EFFORT,
        "chat_template_kwargs": _TEMPLATE_ARGS,
        "chat_template_args": _TEMPLATE_ARGS,
        "response_format": {"anyOf": [{"type": "null"}, _RESPONSE_FORMAT]},
        # Accepted and harmless: they describe the caller or ask for OpenAI-side features with no effect here
        # (caching hints: the engine's prefix cache works unasked; `prediction` only speeds up OpenAI's decoding,
        # and the answer is the same without it).
        "user": {"type": ["string", "null"]},
        "metadata": METADATA,
        "store": _NULLABLE_BOOL,
        "service_tier": {"enum": [*SERVICE_TIERS, None]},
        "safety_identifier": {"type": ["string", "null"]},
        "prompt_cache_key": {"type": ["string", "null"]},
        "prompt_cache_retention": {"type": ["string", "null"]},
        "prompt_cache_options": {"type": ["object", "null"]},
        "prediction": {"type": ["object", "null"]},
        "modalities": {"type": ["array", "null"], "items": {"const": "text"}},
        # Accepted only at their neutral values (checked in request.py).
        "frequency_penalty": {"type": ["number", "null"]},
        "presence_penalty": {"type": ["number", "null"]},
        "logprobs": _NULLABLE_BOOL,
        "top_logprobs": {"type": ["integer", "null"]},
        "logit_bias": {"type": ["object", "null"]},
        "verbosity": {"enum": ["low", "medium", "high", None]},  # a line of instructions (proxy/options.py)
        # Accepted only as null (refused with a value before the schema is checked).
        **{name: {"type": "null"} for name in UNSUPPORTED},
    },
    "additionalProperties": False,
}
