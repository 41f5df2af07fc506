"""The JSON Schema of the Responses requests we accept, and of each kind of input item.

As for Chat Completions (proxy/chat/schema.py), every field OpenAI documents is here, accepted (honoured or
harmless) or refused with a reason; tests/test_spec_fields.py sends every field of the openai SDK's types.
"""

from __future__ import annotations

from typing import Any

from proxy.options import API_EFFORTS
from proxy.responses.output.server_items import SERVER_ITEMS
from proxy.validation import METADATA

MIN_OUTPUT_TOKENS = 16  # OpenAI's least `max_output_tokens`
_NULLABLE_BOOL = {"type": ["boolean", "null"]}
_STRING = {"type": "string"}


def _object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


# Text parts are checked here; other part types are refused by request.py with a clearer message.
_PART = {"type": "object", "required": ["type"],
         "properties": {"type": _STRING, "text": _STRING, "refusal": _STRING}}
_STATUS = {"enum": ["in_progress", "completed", "incomplete", None]}

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
    # `caller` (how the call was made) and `async` are ignored: the call renders the same. openai-python's
    # model_dump() of a ResponseFunctionToolCall writes `async` as `async_`. `namespace`: a namespace tool's member.
    "function_call": _object(["call_id", "name", "arguments"], {
        "type": {"const": "function_call"},
        "id": _STRING,
        "call_id": {"type": "string", "minLength": 1},
        "name": _STRING,
        "arguments": _STRING,
        "status": _STATUS,
        "caller": {"type": ["object", "null"]},
        "async": _NULLABLE_BOOL,
        "async_": _NULLABLE_BOOL,
        "namespace": {"type": ["string", "null"]},
        # the parameters whose values this server sealed (proxy/responses/agent_messages.py)
        "encrypted_function_args": {"type": ["array", "null"], "items": _STRING},
    }),
    # `name` and `namespace` are ignored: the output belongs to the call its `call_id` names.
    "function_call_output": _object(["call_id", "output"], {
        "type": {"const": "function_call_output"},
        "id": {"type": ["string", "null"]},
        "call_id": {"type": "string", "minLength": 1},
        "output": {"anyOf": [_STRING, {"type": "array", "items": _PART}]},
        "status": _STATUS,
        "caller": {"type": ["object", "null"]},
        "name": {"type": ["string", "null"]},
        "namespace": {"type": ["string", "null"]},
    }),
    # A custom tool's call and its output, as function calls' (the input is the model's raw text).
    "custom_tool_call": _object(["call_id", "name", "input"], {
        "type": {"const": "custom_tool_call"},
        "id": _STRING,
        "call_id": {"type": "string", "minLength": 1},
        "name": _STRING,
        "input": _STRING,
        "namespace": {"type": ["string", "null"]},
        "status": _STATUS,
        "caller": {"type": ["object", "null"]},
        "async": _NULLABLE_BOOL,
        "async_": _NULLABLE_BOOL,
    }),
    "custom_tool_call_output": _object(["call_id", "output"], {
        "type": {"const": "custom_tool_call_output"},
        "id": {"type": ["string", "null"]},
        "call_id": {"type": "string", "minLength": 1},
        "output": {"anyOf": [_STRING, {"type": "array", "items": _PART}]},
        "status": _STATUS,
        "caller": {"type": ["object", "null"]},
    }),
    # Tools offered from this point of the conversation: offered with the request's own (client_tools.py).
    "additional_tools": _object(["role", "tools"], {
        "type": {"const": "additional_tools"},
        "id": {"type": ["string", "null"]},
        "role": {"const": "developer"},
        "tools": {"type": "array", "items": {"type": "object"}},
    }),
    # A message between Codex's agents (proxy/responses/agent_messages.py): text, and parts this server sealed.
    "agent_message": _object(["author", "recipient", "content"], {
        "type": {"const": "agent_message"},
        "id": {"type": ["string", "null"]},
        "author": _STRING,
        "recipient": _STRING,
        "content": {"type": "array", "items": {"anyOf": [
            {"type": "object", "required": ["type", "text"], "properties": {"type": {"const": "input_text"},
                                                                           "text": _STRING}},
            {"type": "object", "required": ["type"], "properties": {"type": {"const": "input_image"}}},
            _object(["type", "encrypted_content"], {"type": {"const": "encrypted_content"},
                                                    "encrypted_content": _STRING})]}},
        "agent": {"type": ["object", "null"]},
        "status": _STATUS,
    }),
    "item_reference": _object(["id"], {"type": {"const": "item_reference"}, "id": _STRING}),
    # Settings from this point of the conversation on, until a later update (request/configuration.py).
    "configuration_update": _object([], {
        "type": {"const": "configuration_update"},
        "id": {"type": ["string", "null"]},
        "agent": {"type": ["object", "null"]},
        "reasoning": {"type": ["object", "null"], "properties": {"effort": {"enum": [*API_EFFORTS, None]}},
                      "additionalProperties": False},
        "text": {"type": ["object", "null"], "properties": {
            "format": {"anyOf": [{"type": "null"}, _FORMAT]},
            "verbosity": {"enum": ["low", "medium", "high", None]}}, "additionalProperties": False},
    }),
    # Compaction (proxy/responses/compaction_items.py): a summary sealed by this server, and Codex's request for one.
    "compaction": _object(["encrypted_content"], {
        "type": {"const": "compaction"}, "id": {"type": ["string", "null"]}, "encrypted_content": _STRING,
        "created_by": {"type": ["string", "null"]}}),
    "compaction_trigger": _object([], {"type": {"const": "compaction_trigger"}, "id": {"type": ["string", "null"]}}),
    # Items of the tools the server runs, replayed (proxy/responses/output/server_items.py).
    **SERVER_ITEMS,
}
# Codex's bookkeeping (turn id, time, what the text is) on every item it sends to a provider named "OpenAI" (the
# name that makes it compact on the server): accepted on any item, and ignored.
CODEX_ITEM_METADATA = "internal_chat_message_metadata_passthrough"
ITEMS = {kind: {**schema, "properties": {**schema["properties"], CODEX_ITEM_METADATA: {"type": ["object", "null"]}}}
         for kind, schema in ITEMS.items()}


# The spec's tiers; every request is served, and reported, as "default" (see proxy/chat/schema.py).
SERVICE_TIERS = ["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
INCLUDABLE = ["file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url", "code_interpreter_call.outputs",
              "reasoning.encrypted_content", "message.output_text.logprobs"]

# Fields the Responses API documents that this server cannot honour: with a value, a 400 that says why.
UNSUPPORTED = {
    "prompt": "reusable prompt templates are not supported; send `instructions` and `input`",
    "moderation": "no moderation model runs here; moderate input and output in your application",
}

# `defer_loading` (load through tool search) and `output_schema` are ignored: every tool is declared up front, and
# what the function returns is the client's business. `allowed_callers` and `async` are checked in client_tools.py.
FUNCTION_TOOL = _object(["type", "name"], {
    "type": {"const": "function"},
    "name": _STRING,
    "description": {"type": ["string", "null"]},
    "parameters": {"type": ["object", "null"]},
    "strict": _NULLABLE_BOOL,
    "defer_loading": _NULLABLE_BOOL,
    "output_schema": {"type": ["object", "null"]},
    "allowed_callers": {"type": ["array", "null"], "items": {"enum": ["direct", "programmatic"]}},
    "async": _NULLABLE_BOOL,
})
# A custom (freeform) tool: raw text input, free (`text`) or held to a Lark grammar or a regex (tools/freeform.py).
CUSTOM_TOOL = _object(["type", "name"], {
    "type": {"const": "custom"},
    "name": _STRING,
    "description": {"type": ["string", "null"]},
    "format": {"anyOf": [
        _object(["type"], {"type": {"const": "text"}}),
        _object(["type", "syntax", "definition"], {"type": {"const": "grammar"}, "syntax": {"enum": ["lark", "regex"]},
                                                   "definition": _STRING}),
    ]},
    "defer_loading": _NULLABLE_BOOL,
    "allowed_callers": {"type": ["array", "null"], "items": {"enum": ["direct", "programmatic"]}},
    "async": _NULLABLE_BOOL,
})
# A namespace without a description (Codex's `collaboration`, with no tools) is declared without one.
NAMESPACE_TOOL = _object(["type", "name", "tools"], {
    "type": {"const": "namespace"},
    "name": _STRING,
    "description": {"type": ["string", "null"]},
    "tools": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {"type": _STRING}}},
})
# Tool search (`defer_loading` tools found when the model searches): every tool is declared up front here, so the
# model has nothing to search and never calls it; accepted so that clients that always send it work.
TOOL_SEARCH_TOOL = _object(["type"], {
    "type": {"const": "tool_search"},
    "description": {"type": ["string", "null"]},
    "execution": {"enum": ["server", "client", None]},
    "parameters": {"type": ["object", "null"]},
})
TOOL_SEARCH_NOTE = "Every tool is declared to the model up front, so the model has nothing to search."

# Tool types of the API that no server runs here and the model cannot call: a 400 naming the type, with the reason.
# (gpt-oss's own built-in tools, web_search and code_interpreter, are served by a --tool-server: hosted_request.py.)
REFUSED_TOOLS = {
    "file_search": "there are no vector stores here; declare a function tool that searches your files",
    "computer": "gpt-oss has no computer-use tool",
    "computer_use_preview": "gpt-oss has no computer-use tool",
    "image_generation": "no image model runs here",
    "local_shell": "declare the shell as a function tool",
    "shell": "declare the shell as a function tool",
    "apply_patch": "declare apply_patch as a custom (freeform) or function tool",
    "programmatic_tool_calling": "programmatic tool calling is not offered: the model calls tools directly",
}
# Input item types of the API that this server cannot put into a gpt-oss prompt: a 400 naming the type, with the reason.
REFUSED_ITEMS = {
    "file_search_call": "file search never runs here",
    "computer_call": "gpt-oss has no computer-use tool",
    "computer_call_output": "gpt-oss has no computer-use tool",
    "image_generation_call": "no image model runs here",
    "local_shell_call": "the shell is a function tool here: send function_call items",
    "local_shell_call_output": "the shell is a function tool here: send function_call_output items",
    "shell_call": "the shell is a function tool here: send function_call items",
    "shell_call_output": "the shell is a function tool here: send function_call_output items",
    "apply_patch_call": "apply_patch is a custom or function tool here: send its call items",
    "apply_patch_call_output": "apply_patch is a custom or function tool here: send its call output items",
    "tool_search_call": "every tool is declared up front here, so there is no tool search",
    "tool_search_output": "every tool is declared up front here, so there is no tool search",
    "program": "programmatic tool calling is not offered",
    "program_output": "programmatic tool calling is not offered",
    "multi_agent_call": "the server runs no sub-agents (`multi_agent` is not offered)",
    "multi_agent_call_output": "the server runs no sub-agents (`multi_agent` is not offered)",
}

RESPONSES_REQUEST: dict[str, Any] = _object([], {
    "model": _STRING,
    "input": {"anyOf": [_STRING, {"type": "array", "items": {"type": "object"}}]},
    "instructions": {"type": ["string", "null"]},
    # Each tool is checked by its type: client_tools.py (FUNCTION_TOOL, NAMESPACE_TOOL), hosted_request.py.
    "tools": {"type": ["array", "null"], "items": {"type": "object"}},
    "tool_choice": {"anyOf": [
        {"enum": ["none", "auto", "required", None]},
        _object(["type", "name"], {"type": {"enum": ["function", "custom"]}, "name": _STRING}),
    ]},
    "parallel_tool_calls": _NULLABLE_BOOL,
    "max_tool_calls": {"type": ["integer", "null"], "minimum": 1},
    "reasoning": {"type": ["object", "null"], "properties": {
        "effort": {"enum": [*API_EFFORTS, None]},  # proxy/options.py
        "summary": {"enum": ["auto", "concise", "detailed", None]},
        "generate_summary": {"enum": ["auto", "concise", "detailed", None]},
        # Every value is served as gpt-oss was trained: this turn's reasoning only (the response says "current_turn").
        "context": {"enum": ["auto", "current_turn", "all_turns", None]},
        "mode": {"type": ["string", "null"]},  # only "standard" (request.py)
    }, "additionalProperties": False},
    # OpenAI's minimum: fewer is a 400 `integer_below_min_value` there (proxy/validation.py words it the same).
    "max_output_tokens": {"type": ["integer", "null"], "minimum": MIN_OUTPUT_TOKENS},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},  # 0: greedy (proxy/options.py)
    "text": {"type": ["object", "null"], "properties": {
        "format": {"anyOf": [{"type": "null"}, _FORMAT]},
        "verbosity": {"enum": ["low", "medium", "high", None]},  # proxy/options.py: VERBOSITY_NOTES
    }, "additionalProperties": False},
    "metadata": METADATA,
    "store": _NULLABLE_BOOL,
    "previous_response_id": {"type": ["string", "null"]},
    "conversation": {"anyOf": [{"type": ["string", "null"]}, _object(["id"], {"id": _STRING})]},
    "stream": _NULLABLE_BOOL,
    "stream_options": {"type": ["object", "null"], "properties": {"include_obfuscation": {"type": "boolean"}},
                       "additionalProperties": False},
    "background": _NULLABLE_BOOL,
    "truncation": {"enum": ["disabled", None]},
    # `code_interpreter_call.outputs` adds the python tool's output to its calls
    # (proxy/responses/output/server_output.py);
    # the other built-in tools' extras are never produced here, so asking for them includes nothing; logprobs are
    # refused in request.py.
    "include": {"type": ["array", "null"], "items": {"enum": INCLUDABLE}},
    # Compaction before generating (proxy/responses/compaction.py); a null threshold: 80% of the context window.
    "context_management": {"type": ["array", "null"], "items": _object(["type"], {
        "type": {"const": "compaction"}, "compact_threshold": {"type": ["integer", "null"], "minimum": 1}})},
    "user": {"type": ["string", "null"]},
    # Codex's ids of the installation, session, thread and turn: they describe the caller, not the answer.
    "client_metadata": {"type": ["object", "null"]},
    "safety_identifier": {"type": ["string", "null"]},
    "prompt_cache_key": {"type": ["string", "null"]},
    "service_tier": {"enum": [*SERVICE_TIERS, None]},
    "top_logprobs": {"enum": [0, None]},
    "presence_penalty": {"enum": [0, None]},
    "frequency_penalty": {"enum": [0, None]},
    # Accepted and ignored: caching hints (the engine's prefix cache works unasked), and OpenAI's own scheduling,
    # access and image options, which mean nothing here. `prewarm` answers without generating (`pre_warms`).
    "prompt_cache_retention": {"type": ["string", "null"]},
    "prompt_cache_options": {"type": ["object", "null"], "properties": {"prewarm": _NULLABLE_BOOL}},
    "background_options": {"type": ["object", "null"]},
    "access_programs": {"type": ["object", "null"]},
    "image": {"type": ["object", "null"]},
    # The beta's server-run sub-agents: only `enabled: false` is served (request.py says why).
    "multi_agent": {"type": ["object", "null"], "properties": {
        "enabled": {"type": "boolean"}, "max_concurrent_subagents": {"type": "integer", "minimum": 1}}},
    # Accepted only as null (refused with a value before the schema is checked).
    **{name: {"type": "null"} for name in UNSUPPORTED},
})
