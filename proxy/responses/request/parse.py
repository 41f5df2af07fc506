"""A Responses request body, checked, resolved against the store, and made the prompt we render.

Input items are normalized in `input_items.py` and translated in `conversation.py`. The conversation is the stored
history of `previous_response_id` (its inputs and outputs, chain included), then the new input; only the new
request's `instructions` apply.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.requests import Request

from parsers.conversation import (
    Instructions,
    Item,
    Prompt,
)
from proxy.engines.base import OutputConstraint
from proxy.errors import APIError, invalid_request
from proxy.ids import checked_id
from proxy.options import HARMONY_EFFORT, GenerationOptions, reasoning_effort, refuse_tool_choice_types, with_verbosity
from proxy.options import response_format as _format
from proxy.responses.request.client_tools import CLIENT_TOOL_TYPES, read_client_tools
from proxy.responses.request.configuration import Settings, configured_settings
from proxy.responses.request.conversation import conversation_of
from proxy.responses.request.hosted_request import MAX_SERVER_TOOLS, HostedRequest, split_server_tools
from proxy.responses.request.input_items import input_list, normalize_items, refuse_duplicates
from proxy.responses.request.schema import REFUSED_TOOLS, RESPONSES_REQUEST, UNSUPPORTED
from proxy.responses.request.unseal import Unsealer, off_loop_when_large
from proxy.store.base import ResponseStore
from proxy.validation import check, check_tool_types, compile_schema, parse_off_loop, read_and_parse, refuse_unsupported
from tools.cache import ToolCatalog
from tools.definitions import (
    FunctionTool,
    ResponseFormat,
    ToolChoice,
    ToolError,
    check_choice,
)

_REQUEST = compile_schema(RESPONSES_REQUEST)


logger = logging.getLogger("harmony_proxy")


@dataclass
class ResponsesRequest:
    body: dict[str, Any]  # as sent, checked; echoed in the response object
    model: str
    input_items: list[dict[str, Any]]  # normalized; item references still to resolve
    tools: list[FunctionTool]  # the client's: functions, and the members of its namespace tools
    tool_namespaces: dict[str, str]  # the client's namespace tools: name -> description
    tool_echo: list[dict[str, Any]]  # the client's `tools` as the response lists them
    tool_choice: ToolChoice
    effort: str
    response_format: ResponseFormat | None
    options: GenerationOptions
    max_tool_calls: int | None  # 1 when parallel_tool_calls is false
    store: bool
    stream: bool
    background: bool
    conversation: str | None  # the id of the conversation this response continues and adds to
    hosted: HostedRequest = field(default_factory=HostedRequest)  # tools the server runs (MCP, browser, python)
    summaries: bool = False  # `reasoning.summary` asked: the reasoning also streams as its summary
    # The settings in effect, as the API names them: the request's, or a configuration_update's (configuration.py).
    effort_name: str | None = None
    verbosity: str | None = None
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})

    @property
    def prewarm(self) -> bool:
        """`prompt_cache_options.prewarm`: checked and rendered, not generated (the WebSocket's `generate: false`)."""
        return (self.body.get("prompt_cache_options") or {}).get("prewarm") is True

    @property
    def sealed_reasoning(self) -> bool:
        """Reasoning items are to carry `encrypted_content` (proxy/responses/sealing.py)."""
        return "reasoning.encrypted_content" in (self.body.get("include") or ())

    def constraint(self) -> OutputConstraint:
        offered = () if self.tool_choice.mode == "none" else tuple(self.tools)
        parallel = self.body.get("parallel_tool_calls") is not False
        return OutputConstraint(offered, self.tool_choice, self.response_format, parallel)


async def read_responses_request(
    request: Request, default_effort: str, default_model: str | None, tools: ToolCatalog
) -> ResponsesRequest:
    """The request body, read and parsed (off the event loop when it is large)."""
    return await read_and_parse(
        request, lambda body: parse_responses_request(body, default_effort, default_model, tools))


def parse_responses_request(
    body: dict[str, Any], default_effort: str, default_model: str | None, tools: ToolCatalog | None = None
) -> ResponsesRequest:
    """`tools` checks and remembers tool declarations and bounds their number and size (defaults: a new one);
    `default_model` None: `model` is required."""
    catalog = ToolCatalog() if tools is None else tools
    refuse_unsupported(body, UNSUPPORTED)
    if default_model is None and body.get("model") is None:
        raise invalid_request("Missing required parameter: 'model'.", param="model",
                              code="missing_required_parameter")
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > catalog.max_tools + MAX_SERVER_TOOLS:
        raise invalid_request(f"Invalid 'tools': array too long ({len(tools)} tools).", param="tools",
                              code="array_above_max_length")  # before anything looks at each of them
    body, hosted = split_server_tools(body)  # from here on `body` holds the function tools only
    check_tool_types(body.get("tools"), catalog, CLIENT_TOOL_TYPES, REFUSED_TOOLS)
    refuse_tool_choice_types(body.get("tool_choice"), ("function", "custom"))
    check(body, _REQUEST)
    _refuse_unhonoured(body)
    store, background = body.get("store") is not False, bool(body.get("background"))
    if background and not store:
        raise invalid_request("`background` responses must be stored: send `store: true`.", param="background")
    if background and body.get("stream"):
        raise invalid_request("Background responses are not streamed here: poll GET /v1/responses/{id} instead.",
                              param="stream", code="unsupported_parameter")
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = checked_id(conversation["id"], "conversation.id")
    elif conversation is not None:
        checked_id(conversation, "conversation")
    if body.get("previous_response_id") is not None:
        checked_id(body["previous_response_id"], "previous_response_id")
    if conversation is not None and body.get("previous_response_id") is not None:
        raise invalid_request("`conversation` and `previous_response_id` are mutually exclusive: send one of them.",
                              param="conversation", code="mutually_exclusive_parameters")
    if conversation is not None and not store:
        raise invalid_request("A response in a `conversation` is stored in it: leave `store` true.", param="store")
    items = normalize_items(input_list(body.get("input")), "input")
    client = read_client_tools(body.get("tools") or [], items, catalog)
    for server in hosted.mcp:
        if server.label in client.namespaces:
            raise invalid_request(f"server_label {server.label!r} is also the name of a namespace tool; names must be "
                                  "unique.", param=f"{server.param}.server_label")
    try:
        choice = _tool_choice(body.get("tool_choice"))
        check_choice(choice, client.tools, "tool_choice")
    except ToolError as exc:
        raise invalid_request(str(exc), param=exc.param, code=exc.code) from None
    reasoning = body.get("reasoning") or {}
    text_format = (body.get("text") or {}).get("format") or {"type": "text"}
    max_tool_calls = body.get("max_tool_calls")
    if body.get("parallel_tool_calls") is False:
        max_tool_calls = 1
    return ResponsesRequest(
        body=body,
        model=body.get("model") or default_model or "",
        input_items=items,
        tools=client.tools,
        tool_namespaces=client.namespaces,
        tool_echo=client.echo,
        tool_choice=choice,
        effort=reasoning_effort(default_effort, ("reasoning.effort", reasoning.get("effort"))),
        response_format=_format(text_format["type"], text_format, "text.format"),
        options=GenerationOptions(max_tokens=body.get("max_output_tokens"), temperature=body.get("temperature"),
                                  top_p=body.get("top_p")),
        max_tool_calls=max_tool_calls,
        store=store,
        stream=bool(body.get("stream")),
        background=background,
        conversation=conversation,
        hosted=hosted,
        summaries=(reasoning.get("summary") or reasoning.get("generate_summary")) is not None,
        effort_name=reasoning.get("effort"),
        verbosity=(body.get("text") or {}).get("verbosity"),
        text_format=text_format,
    )


async def resolve(request: ResponsesRequest, store: ResponseStore | None,
                  history: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(history, input items) with `previous_response_id` or `conversation`, and item references, looked up in
    the store; `history`: the previous response's, when the caller has it (a WebSocket connection keeps its own).
    The settings of their configuration_update items become the request's."""
    previous = request.body.get("previous_response_id")
    if history is None:
        history = []
    elif previous:
        previous = None  # known already
    if previous:
        found = await store.history(previous) if store is not None else None
        if found is None:
            raise APIError(404, f"Previous response with id '{previous}' not found.", param="previous_response_id",
                           code="previous_response_not_found")
        history = found
    elif request.conversation is not None:
        found = await store.conversation_items(request.conversation) if store is not None else None
        if found is None:
            raise conversation_not_found(request.conversation)
        history = found
    resolved = await resolve_references(request.input_items, store, "input")
    if request.conversation is not None:  # every item of a conversation has an id of its own
        refuse_duplicates([item["id"] for item in history], resolved, "input")
    settings = configured_settings(history + resolved)
    await parse_off_loop(partial(_apply, settings, request), large=False)  # a format's new schema: off the loop
    return history, resolved


def _apply(settings: Settings, request: ResponsesRequest) -> None:
    """configuration_update items' settings win over the request's own (configuration.py)."""
    if settings.effort is not None:
        request.effort, request.effort_name = HARMONY_EFFORT[settings.effort], settings.effort
    if settings.verbosity is not None:
        request.verbosity = settings.verbosity
    if settings.text_format is not None:
        request.text_format = settings.text_format
        request.response_format = _format(settings.text_format["type"], settings.text_format, "text.format")


def offer_earlier_tools(request: ResponsesRequest, history: list[dict[str, Any]], items: list[dict[str, Any]],
                        catalog: ToolCatalog) -> None:
    """The tools of additional_tools items from the stored chain, the conversation or a referenced item are offered
    too, as those of the input are (read when the request was parsed)."""
    if not any(item["type"] == "additional_tools" for item in history) and \
            sum(item["type"] == "additional_tools" for item in items) == \
            sum(item["type"] == "additional_tools" for item in request.input_items):
        return
    client = read_client_tools(request.body.get("tools") or [], history + items, catalog)
    request.tools, request.tool_namespaces = client.tools, client.namespaces


async def resolve_references(items: list[dict[str, Any]], store: ResponseStore | None,
                             param: str) -> list[dict[str, Any]]:
    """The items with each `item_reference` replaced by the stored item it names (404 if none)."""
    references = [item["id"] for item in items if item["type"] == "item_reference"]
    if not references:
        return items
    stored = await store.items(references) if store is not None else {}
    resolved = []
    for position, item in enumerate(items):
        if item["type"] == "item_reference":
            if item["id"] not in stored:
                raise APIError(404, f"Item with id '{item['id']}' not found.", param=f"{param}[{position}].id",
                               code="item_not_found")
            item = stored[item["id"]]
        resolved.append(item)
    return resolved


def conversation_not_found(conversation_id: str) -> APIError:
    return APIError(404, f"Conversation with id '{conversation_id}' not found.", param="conversation",
                    code="not_found")


async def prompt_for(request: ResponsesRequest, history: list[dict[str, Any]], items: list[dict[str, Any]],
                     unsealer: Unsealer, generate: bool = True) -> Prompt:
    """The conversation to render; `unsealer` opens the encrypted_content of reasoning, compaction and agent-message
    items."""
    everything = history + items
    conversation = await off_loop_when_large(everything, lambda: conversation_of(everything, len(history), unsealer))
    return prompt_with(request, conversation, generate)


def prompt_with(request: ResponsesRequest, conversation: list[Item], generate: bool = True) -> Prompt:
    """The prompt of a conversation (history and input, translated): this request's instructions first.
    `generate: false` (a WebSocket pre-warm) may keep instructions alone: Codex pre-warms with its developer
    message before the first user message."""
    if request.body.get("instructions"):  # earlier instructions are not carried over
        conversation = [Instructions(request.body["instructions"]), *conversation]
    conversation = with_verbosity(conversation, request.verbosity)
    if generate and not any(not isinstance(item, Instructions) for item in conversation):
        raise invalid_request("The conversation is empty: send `input`.", param="input")
    offered = [] if request.tool_choice.mode == "none" else request.tools
    prompt = Prompt(conversation, offered, request.effort, request.response_format)
    if request.tool_choice.mode != "none":
        prompt.tool_namespaces = request.tool_namespaces
    return prompt


def _refuse_unhonoured(body: dict[str, Any]) -> None:
    """Documented values that would change the answer in a way this server cannot: a 400 that says why."""
    reasoning, include = body.get("reasoning") or {}, body.get("include") or []
    mode = reasoning.get("mode")
    logprobs = include.index("message.output_text.logprobs") if "message.output_text.logprobs" in include else -1
    refused = [
        (f"include[{logprobs}]", logprobs >= 0,
         "Log probabilities are not supported: leave 'message.output_text.logprobs' out of `include`."),
        ("multi_agent", (body.get("multi_agent") or {}).get("enabled") is True,
         ("`multi_agent` is not supported: the server runs no sub-agents, and Harmony has no form for a tree of "
          "agents generating at once; run sub-agents in the client (Codex's multi-agent tools work here).")),
        ("reasoning.mode", mode not in (None, "standard"),
         f"`reasoning.mode` {mode!r} is not supported: gpt-oss has one mode, 'standard'; set `reasoning.effort`."),
    ]
    for param, is_refused, message in refused:
        if is_refused:
            raise invalid_request(message, param=param, code="unsupported_parameter")


def _tool_choice(value: Any) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, str):
        return ToolChoice(value)
    return ToolChoice(value["type"], value["name"])  # function or custom

