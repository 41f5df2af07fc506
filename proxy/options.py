"""What every API asks of one generation, and how it becomes an engine request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parsers.conversation import Instructions, Item
from parsers.vocab import Vocab
from proxy.engines.base import GenerationRequest, OutputConstraint, SamplingParams
from proxy.errors import invalid_request
from tools.definitions import MAX_SCHEMA_DEPTH, ResponseFormat, enforceability_error, json_depth
from tools.schema_bounds import schema_bounds_error
from tools.schema_check import enforcement, schema_error


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int | None = None  # None: up to the context window
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()  # stop strings, matched against the visible answer text


def response_format(kind: str, json_schema: dict[str, Any] | None, param: str) -> ResponseFormat | None:
    """The structured-output format of `response_format` (chat) or `text.format` (Responses); None for text.

    The schema is checked as tool parameters are: a valid JSON Schema, no `$ref` to nothing, and with `strict`
    nothing the grammar engine cannot enforce (400s naming `param`.schema)."""
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object", {"type": "object"}, "Respond with a JSON object.", kind="json_object")
    if not json_schema or "name" not in json_schema or "schema" not in json_schema:
        raise invalid_request("A json_schema format needs a `name` and a `schema`.", param=param)
    schema, strict = json_schema["schema"], json_schema.get("strict") is True
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        raise invalid_request(f"The schema is nested more than {MAX_SCHEMA_DEPTH} levels deep.",
                              param=f"{param}.schema")
    too_large = schema_bounds_error(schema)
    if too_large is not None:
        raise invalid_request(f"The schema of response format {json_schema['name']!r} is too large: {too_large}.",
                              param=f"{param}.schema")
    problem = schema_error(schema)
    if problem is None:
        problem = enforceability_error(schema, strict)
    if problem is not None:
        raise invalid_request(f"Invalid schema for response format {json_schema['name']!r}: {problem}",
                              param=f"{param}.schema")
    compiles = enforcement(schema, strict).error is None
    return ResponseFormat(json_schema["name"], schema, json_schema.get("description") or "", strict,
                          compiles=compiles)


def refuse_tool_choice_types(value: Any, accepted: tuple[str, ...] = ("function",)) -> None:
    """tool_choice objects other than a named tool of the `accepted` types (`allowed_tools`, `mcp`, built-in tools;
    `custom` on Chat Completions): a 400 naming the type."""
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(kind, str) and kind not in accepted:
        raise invalid_request(
            f"tool_choice type {kind!r} is not supported: send only the tools the model may call, with tool_choice "
            "'auto', 'required', 'none' or a function.",
            param="tool_choice.type",
            code="unsupported_parameter",
        )


# Harmony has three reasoning levels; the APIs' seven efforts map onto them. gpt-oss always reasons, so `none` and
# `minimal` get its shortest reasoning, and `xhigh` and `max` its longest.
HARMONY_EFFORT = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                  "max": "high"}
API_EFFORTS = list(HARMONY_EFFORT)

# `verbosity` (text.verbosity, or Chat's verbosity): gpt-oss has no control of its own, so low and high become one
# line of the developer instructions; medium, the default, adds nothing.
VERBOSITY_NOTES = {
    "low": "Verbosity: low. Keep the final answer short: say only what the user needs.",
    "high": "Verbosity: high. Make the final answer thorough: explain the details and the reasons.",
}


def reasoning_effort(default: str, *sources: tuple[str, str | None]) -> str:
    """The Harmony level of the first effort given, in the order of `sources` (name, value); else the default."""
    for _name, value in sources:
        if value is not None:
            return HARMONY_EFFORT[value]
    return default


def with_verbosity(conversation: list[Item], verbosity: str | None) -> list[Item]:
    """The conversation with the verbosity note after its leading instructions (none for medium)."""
    note = VERBOSITY_NOTES.get(verbosity or "medium")
    if note is None:
        return conversation
    leading = 0
    while leading < len(conversation) and isinstance(conversation[leading], Instructions):
        leading += 1
    return [*conversation[:leading], Instructions(note), *conversation[leading:]]


def generation_request(
    request_id: str,
    prompt_token_ids: list[int],
    options: GenerationOptions,
    constraint: OutputConstraint,
    vocab: Vocab,
    max_model_len: int,
    prompt_param: str = "messages",
    max_tokens_param: str = "max_tokens",
    routing_hints: tuple[str, ...] = (),
) -> GenerationRequest:
    """Check the prompt and token budget against the context window; a 400 like OpenAI's if they do not fit."""
    prompt_length = len(prompt_token_ids)
    requested = options.max_tokens
    if prompt_length >= max_model_len or (requested is not None and prompt_length + requested > max_model_len):
        asked = f" and {requested} output tokens" if requested is not None else ""
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_length} prompt tokens{asked}. Please reduce the length of the messages or the output limit.",
            param=prompt_param if requested is None or prompt_length >= max_model_len else max_tokens_param,
            code="context_length_exceeded",
        )
    # top_p 0 keeps only the likeliest token (OpenAI accepts it): greedy decoding, which engines take as
    # temperature 0 (vLLM and TensorRT-LLM refuse a top_p of 0), as proxy/completions.py does.
    greedy = options.top_p == 0
    sampling = SamplingParams(
        max_tokens=requested if requested is not None else max_model_len - prompt_length,
        temperature=0.0 if greedy else options.temperature,
        top_p=None if greedy else options.top_p,
        seed=options.seed,
        stop_token_ids=vocab.stop_token_ids,
        min_tokens=options.min_tokens,
        ignore_eos=options.ignore_eos,
    )
    return GenerationRequest(request_id, prompt_token_ids, sampling, constraint, routing_hints)


# Headers by which clients name their session: Codex (`session-id`, `thread-id`), opencode and TensorRT-LLM's
# router (`x-session-id`, `x-session-affinity`), Dynamo-style correlation ids.
SESSION_HEADERS = ("session-id", "x-session-id", "x-session-affinity", "thread-id", "x-correlation-id")


def routing_hints(headers: Mapping[str, str], *keys: object) -> tuple[str, ...]:
    """The session keys of a request, for routing it where its session went: `keys` (body fields such as
    previous_response_id and prompt_cache_key, most specific first) and then the session headers."""
    hints = [key for key in keys if isinstance(key, str) and key]
    hints += [f"{name}:{headers[name]}" for name in SESSION_HEADERS if headers.get(name)]
    return tuple(hints)
