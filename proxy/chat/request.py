"""A Chat Completions request body, checked and translated into a Harmony prompt and generation options.

Decisions (documented in the README):
- System and developer messages that open the conversation become the Harmony developer instructions, joined
  by blank lines in order; later ones are rendered where they stand.
- reasoning_effort: top-level `reasoning_effort` wins over `chat_template_kwargs.reasoning_effort`, which wins
  over `chat_template_args.reasoning_effort`; otherwise the server default.
- Content given as a list of text parts is joined with newlines.
- An assistant message with `tool_calls` renders as analysis, then its content as a commentary preamble, then
  the calls; without calls its content is a final answer. `reasoning_content` and `reasoning` are both read.
- What SDKs add to the messages they send back is ignored (schema.ASSISTANT_ANNOTATIONS, a tool message's `name`,
  a tool call's `index`); `audio`, `function_call` and `images` on a message are accepted only when null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from parsers.conversation import (
    AssistantMessage,
    Instructions,
    Item,
    Prompt,
    Reasoning,
    ToolCall,
    ToolResult,
    UserMessage,
)
from proxy.chat.schema import CHAT_REQUEST, MESSAGE_NULL_ONLY, MESSAGES, NEUTRAL, REFUSED_TOOLS, UNSUPPORTED
from proxy.engines.base import OutputConstraint
from proxy.errors import invalid_request
from proxy.options import GenerationOptions, reasoning_effort, refuse_tool_choice_types, with_verbosity
from proxy.options import response_format as _format
from proxy.validation import check, check_tool_types, compile_schema, read_and_parse, refuse_unsupported
from tools.cache import ToolCatalog
from tools.definitions import FunctionTool, ToolChoice, ToolError, check_choice, check_unique, make_tool

_REQUEST = compile_schema(CHAT_REQUEST)
_MESSAGE = {role: compile_schema(schema) for role, schema in MESSAGES.items()}


@dataclass
class ChatRequest:
    model: str
    prompt: Prompt
    options: GenerationOptions
    constraint: OutputConstraint
    stream: bool
    include_usage: bool
    parallel_tool_calls: bool
    prompt_cache_key: str | None = None  # a routing hint only (proxy/engines/upstream/routing.py)


async def read_chat_request(request: Request, default_effort: str, tools: ToolCatalog) -> ChatRequest:
    """The request body, read and parsed (off the event loop when it is large)."""
    return await read_and_parse(request, lambda body: parse_chat_request(body, default_effort, tools))


def parse_chat_request(body: dict[str, Any], default_effort: str, tools: ToolCatalog | None = None) -> ChatRequest:
    """`tools` checks and remembers tool declarations and bounds their number and size (defaults: a new one)."""
    catalog = ToolCatalog() if tools is None else tools
    refuse_unsupported(body, UNSUPPORTED)
    check_tool_types(body.get("tools"), catalog, refused=REFUSED_TOOLS)
    refuse_tool_choice_types(body.get("tool_choice"))
    for position, message in enumerate(body.get("messages") if isinstance(body.get("messages"), list) else []):
        if not isinstance(message, dict):
            break  # the schema refuses it next: a list of wrong items is not walked to its end
        if message.get("role") == "function":
            raise invalid_request("Messages with role 'function' are not supported: send the result of the deprecated "
                                  "function call as a `tool` message.", param=f"messages[{position}].role",
                                  code="unsupported_parameter")
    check(body, _REQUEST)
    for position, message in enumerate(body["messages"]):
        _refuse_null_only(message, f"messages[{position}]")
        check(message, _MESSAGE[message["role"]], f"messages[{position}]")
    for name, (neutral, reason) in NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise invalid_request(f"`{name}` is not supported: {reason}.", param=name, code="unsupported_parameter")
    if body.get("logit_bias"):
        raise invalid_request("`logit_bias` is not supported.", param="logit_bias", code="unsupported_parameter")
    if (body.get("n") or 1) > 1:
        raise invalid_request("Only n=1 is supported.", param="n", code="unsupported_parameter")

    try:
        functions = [t["function"] for t in body.get("tools") or []]
        offered_tools = catalog.read(
            [(f["name"], f.get("description"), f.get("parameters"), f.get("strict")) for f in functions],
            lambda position: f"tools[{position}].function",
        )
        check_unique(offered_tools, "tools")
        choice = _tool_choice(body.get("tool_choice"), offered_tools)
        check_choice(choice, offered_tools, "tool_choice")
        items = _items(body["messages"])
    except ToolError as exc:
        raise invalid_request(str(exc), param=exc.param, code=exc.code) from None

    requested_format = body.get("response_format") or {"type": "text"}
    response_format = _format(requested_format["type"], requested_format.get("json_schema"),
                              "response_format.json_schema")
    offered = [] if choice.mode == "none" else offered_tools
    effort = reasoning_effort(
        default_effort,
        ("reasoning_effort", body.get("reasoning_effort")),
        ("chat_template_kwargs.reasoning_effort", (body.get("chat_template_kwargs") or {}).get("reasoning_effort")),
        ("chat_template_args.reasoning_effort", (body.get("chat_template_args") or {}).get("reasoning_effort")),
    )
    stop = body.get("stop")
    parallel = body.get("parallel_tool_calls") is not False
    return ChatRequest(
        model=body["model"],
        prompt=Prompt(with_verbosity(items, body.get("verbosity")), offered, effort, response_format),
        options=GenerationOptions(
            max_tokens=_max_tokens(body),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            seed=body.get("seed"),
            min_tokens=body.get("min_tokens") or 0,
            ignore_eos=bool(body.get("ignore_eos")),
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        ),
        constraint=OutputConstraint(tuple(offered), choice, response_format, parallel),
        stream=bool(body.get("stream")),
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        parallel_tool_calls=parallel,
        prompt_cache_key=body.get("prompt_cache_key"),
    )


def _max_tokens(body: dict[str, Any]) -> int | None:
    legacy, current = body.get("max_tokens"), body.get("max_completion_tokens")
    if legacy is not None and current is not None and legacy != current:
        raise invalid_request(
            "`max_tokens` and `max_completion_tokens` differ; send one of them.", param="max_completion_tokens"
        )
    return current if current is not None else legacy


def _refuse_null_only(message: dict[str, Any], where: str) -> None:
    for name, reason in MESSAGE_NULL_ONLY.items():
        if message.get(name) not in (None, [], {}):
            raise invalid_request(f"`{where}.{name}` is not supported: {reason}.", param=f"{where}.{name}",
                                  code="unsupported_parameter")


def _tool_choice(value: Any, tools: list[FunctionTool]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, str):
        return ToolChoice(value)
    return ToolChoice("function", value["function"]["name"])


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text") or part.get("refusal") or "" for part in content)


def _items(messages: list[dict[str, Any]]) -> list[Item]:
    items: list[Item] = []
    call_names: dict[str, str] = {}
    for position, message in enumerate(messages):
        role = message["role"]
        if role in ("system", "developer"):
            items.append(Instructions(_text(message["content"])))
        elif role == "user":
            items.append(UserMessage(_user_text(message["content"], position)))
        elif role == "assistant":
            items.extend(_assistant_items(message, position, call_names))
        else:  # tool
            call_id = message["tool_call_id"]
            if call_id not in call_names:
                raise invalid_request(
                    f"messages[{position}].tool_call_id {call_id!r} does not match a tool call of an earlier "
                    "assistant message.",
                    param=f"messages[{position}].tool_call_id",
                )
            items.append(ToolResult(call_id, call_names[call_id], _text(message["content"])))
    return items


def _user_text(content: Any, position: int) -> str:
    if isinstance(content, list):
        for index, part in enumerate(content):
            where = f"messages[{position}].content[{index}].text"
            if part["type"] == "text" and "text" not in part:
                raise invalid_request(f"Missing required parameter: '{where}'.", param=where,
                                      code="missing_required_parameter")
            if part["type"] == "text" and not isinstance(part["text"], str):
                raise invalid_request(f"Invalid type for '{where}': expected a string.", param=where)
            if part["type"] != "text" or not isinstance(part.get("text"), str):
                raise invalid_request(
                    f"Content part type {part['type']!r} is not supported: gpt-oss takes text only.",
                    param=f"messages[{position}].content[{index}]",
                    code="unsupported_content",
                )
    return _text(content)


def _assistant_items(message: dict[str, Any], position: int, call_names: dict[str, str]) -> list[Item]:
    where = f"messages[{position}]"
    reasoning_content, reasoning = message.get("reasoning_content"), message.get("reasoning")
    if reasoning_content and reasoning and reasoning_content != reasoning:
        raise invalid_request(
            f"{where} has both `reasoning_content` and `reasoning`, and they differ; send one.",
            param=f"{where}.reasoning",
        )
    calls = message.get("tool_calls") or []
    text = "\n\n".join(part for part in (_text(message.get("content")), message.get("refusal") or "") if part)
    items: list[Item] = []
    if reasoning_content or reasoning:
        items.append(Reasoning(reasoning_content or reasoning))
    if text:
        items.append(AssistantMessage(text, preamble=bool(calls)))
    for index, call in enumerate(calls):
        name = call["function"]["name"]
        make_tool(name, None, None, None, f"{where}.tool_calls[{index}].function")  # a name we can write back
        call_names[call["id"]] = name
        items.append(ToolCall(call["id"], name, call["function"]["arguments"]))
    return items
