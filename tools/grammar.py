"""An output constraint (tool choice, tools, response format) as grammars an engine can enforce.

The grammar covers the whole Harmony completion, everything the model writes after the prompt's final
`<|start|>assistant`: analysis stays free, and the constrained part is exact.

    completion := ("<|start|>assistant")? (note NEXT)* answer       NEXT := "\\n"? <|start|>assistant
    note       := <|channel|>analysis<|message|>TEXT<|end|>  |  <|channel|>commentary<|message|>TEXT<|end|>
    answer     := call | final

- A call: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`, ARGS JSON valid
  against the tool's parameters. The header variants gpt-oss really writes are accepted (recipient before the
  channel, the analysis channel, `<|constrain|>json` with or without a space, ` json`, ` code`, none), so the
  model is never pushed off its own path mid-header. `<|call|>` is optional in the grammar: engines that count
  it as an EOS/stop token of their matcher (SGLang passes the model's whole EOS list) can never match it as a
  grammar literal, so there the complete call ends on EOS like a final answer; elsewhere the literal is there.
  Either way the completion parses as the same call.
- A final answer: `<|channel|>final<|message|>BODY`, then `<|return|>`, which is the EOS token of the tokenizer
  the grammar is compiled with (llguidance allows EOS exactly where the grammar is complete and can never match
  the EOS token as a grammar literal). BODY is JSON with a response format, free text otherwise.
- A custom (freeform) tool's call: the same headers, then its raw input, held to its Lark grammar (nested as
  `%lark { ... }`) or regex, or free text (tools/freeform.py). A custom tool with a grammar constrains the completion
  as a strict tool does. xgrammar's structural tag takes the regex, but has no form for Lark: that input is free
  there (`OutputGrammar.structural_tag_gaps`, logged by the engines that send the tag).
- One call per completion: `<|call|>` is a stop token, so a Harmony turn holds one call whatever
  `parallel_tool_calls` says; gpt-oss makes parallel calls as successive completions (see `output_grammar`).
- Preambles (recipient-less commentary, shown to the user as content) may precede a call or a free final
  answer, never a JSON final answer: the client would receive the preamble inside the JSON content.
- Free text is `/(.|\\n)*/`: special tokens are not text, so none can appear inside a message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tools.definitions import FunctionTool, ResponseFormat, ToolChoice
from tools.freeform import Freeform
from tools.schema_check import grammar_options

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_CHANNELS = ("commentary", "analysis")  # gpt-oss writes calls on both
_CONTENT_TYPES = (" <|constrain|>json", "<|constrain|>json", " json", " code", "")
_NEXT = "<|start|>assistant"


@dataclass(frozen=True)
class OutputGrammar:
    lark: str  # llguidance's Lark dialect (special tokens written bare, `%json {...}`): the whole completion
    structural_tag: dict[str, Any]  # xgrammar's structural tag (the `{"type": "structural_tag", "format": ...}` form)
    summary: str  # one line for logs, e.g. "a call to get_weather required; analysis free"
    key: str  # a content hash: equal grammars, equal keys (compile caches use it)
    structural_tag_gaps: str = ""  # what the structural tag leaves free ('' when nothing): Lark custom-tool grammars


@dataclass(frozen=True)
class _Call:
    name: str
    recipient: str  # `functions.NAME`, or `NS.NAME` for a member of the client's namespace tool
    schema: dict[str, Any]
    strict: bool  # unsupported keywords are errors, not ignored
    freeform: Freeform | None = None  # a custom tool: its body is raw text in this format, not JSON


@dataclass(frozen=True)
class _Plan:
    calls: tuple[_Call, ...]  # the calls the model may make
    final: str | None  # "json", "text", or None: no final answer (a call is required)
    final_schema: dict[str, Any] | None  # the JSON final answer's schema
    final_strict: bool
    summary: str


def output_grammar(
    tools: Sequence[FunctionTool], tool_choice: ToolChoice, response_format: ResponseFormat | None,
    parallel_tool_calls: bool = True,
) -> OutputGrammar | None:
    """The grammar of what the model may write, or None when nothing is constrained (the common case).

    `parallel_tool_calls` does not change the grammar: gpt-oss ends every call with `<|call|>`, a stop token,
    so one completion holds at most one call (the recorded parallel calls are successive turns, each after the
    previous result); `false` is therefore always honoured and `true` needs nothing more.
    """
    plan = _plan(tools, tool_choice, response_format)
    if plan is None:
        return None
    lark = _lark(plan)
    gaps = [call.name for call in plan.calls if call.freeform is not None and call.freeform.structural_tag() is None]
    return OutputGrammar(lark, _structural_tag(plan), plan.summary, hashlib.sha256(lark.encode()).hexdigest(),
                         f"the Lark grammar of custom tool {', '.join(gaps)}" if gaps else "")


def arguments_schema(tool: FunctionTool, enforce: bool) -> dict[str, Any]:
    """The JSON Schema a call's arguments are held to: the tool's own when enforced, any object otherwise."""
    if not enforce:
        return _ANY_OBJECT
    if tool.parameters is None:  # a function without parameters takes `{}`
        return {"type": "object", "properties": {}, "additionalProperties": False} if tool.strict else _ANY_OBJECT
    # `compiles` was settled when the tool was checked (tools.definitions.make_tool): no grammar engine runs here
    return tool.parameters if tool.compiles else _ANY_OBJECT


def with_options(schema: dict[str, Any], strict: bool) -> dict[str, Any]:
    """The schema with llguidance's options (`x-guidance`, top level only): lenient unless strict."""
    return {**{k: v for k, v in schema.items() if k != "x-guidance"}, "x-guidance": grammar_options(strict)}


def _plan(tools: Sequence[FunctionTool], choice: ToolChoice, response_format: ResponseFormat | None) -> _Plan | None:
    callable_tools = [] if choice.mode == "none" else list(tools)
    if choice.names_tool:
        custom = choice.mode == "custom"
        callable_tools = [tool for tool in callable_tools
                          if tool.name == choice.name and (tool.freeform is not None) == custom]
    forced = choice.forces_call and bool(callable_tools)
    strict = [tool for tool in callable_tools
              if tool.strict or (tool.freeform is not None and tool.freeform.constrained)]
    if not forced and response_format is None and not strict:
        return None
    calls = tuple(
        _Call(tool.name, tool.recipient, arguments_schema(tool, forced or bool(tool.strict)), bool(tool.strict),
              tool.freeform)
        for tool in callable_tools
    )
    if forced:
        names = ", ".join(call.name for call in calls)
        summary = f"a call to {'one of ' if len(calls) > 1 else ''}{names} required; analysis free"
        return _Plan(calls, None, None, False, summary)
    parts = []
    if response_format is not None:
        final_strict = response_format.strict
        final_schema = response_format.schema if response_format.compiles else _ANY_OBJECT
        parts.append(f"final answer JSON ({response_format.name})")
    else:
        final_schema, final_strict = None, False
        parts.append("final answer free")
    if any(tool.freeform is None for tool in strict):
        parts.append("strict arguments for " + ", ".join(tool.name for tool in strict if tool.freeform is None))
    if any(tool.freeform is not None for tool in strict):
        parts.append("input grammars of " + ", ".join(tool.name for tool in strict if tool.freeform is not None))
    if calls:
        parts.append("calls to declared tools only")
    final = "json" if final_schema is not None else "text"
    return _Plan(calls, final, final_schema, final_strict, "; ".join(parts) + "; analysis free")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: the names and channel words here are plain ASCII


def _lark(plan: _Plan) -> str:
    lines = [
        "%llguidance {}",
        "// A Harmony completion after the prompt's <|start|>assistant; <|return|> is the EOS token.",
    ]
    if plan.final == "json":  # preambles only on the way to a call: they would land inside the JSON content
        lines.append("start: lead? (analysis next)* (final | (note next)* call)" if plan.calls else
                     "start: lead? (analysis next)* final")
    elif plan.final == "text":
        lines.append("start: lead? (note next)* (final | call)" if plan.calls else "start: lead? (note next)* final")
    else:
        lines.append("start: lead? (note next)* call")
    lines += [
        'lead: <|start|> "assistant"',
        'next: "\\n"? <|start|> "assistant"',
        "note: analysis | preamble",
        'analysis: <|channel|> "analysis" <|message|> TEXT <|end|>',
        'preamble: <|channel|> "commentary" <|message|> TEXT <|end|>',
        "TEXT: /(.|\\n)*/",
    ]
    if plan.final == "json":
        lines.append('final: <|channel|> "final" (" "? <|constrain|> "json" | " json")? <|message|> answer_json')
        lines.append(f"answer_json: %json {_json(with_options(plan.final_schema or {}, plan.final_strict))}")
    elif plan.final == "text":
        lines.append('final: <|channel|> "final" <|message|> TEXT')
    if plan.calls:
        lines += [
            "call: " + " | ".join(f"call_{index}" for index in range(len(plan.calls))),
            'CHANNEL: "commentary" | "analysis"',
            'content_type: " "? <|constrain|> "json" | " json" | " code"',
            "LEAD_SPACE: /[ \\t\\n]{1,4}/",
        ]
        for index, call in enumerate(plan.calls):
            recipient = _literal(f" to={call.recipient}")
            header = f"(<|channel|> CHANNEL {recipient} | {recipient} <|channel|> CHANNEL) content_type?"
            if call.freeform is not None:  # a custom tool: its raw input, held to its grammar
                lines += [f"call_{index}: {header} <|message|> args_{index} <|call|>?",
                          f"args_{index}: {call.freeform.lark_rule()}"]
                continue
            lines += [
                f"call_{index}: {header} <|message|> LEAD_SPACE? args_{index} <|call|>?",
                f"args_{index}: %json {_json(with_options(call.schema, call.strict))}",
            ]
    return "\n".join(lines) + "\n"


def _structural_tag(plan: _Plan) -> dict[str, Any]:
    """The same language in xgrammar's structural-tag formats (special tokens written as their text).

    Built only from formats every xgrammar with the `format` form has (sequence, or, const_string, tag,
    any_text, json_schema, tags_with_separator); `<|return|>` is left to the engine's stop tokens, as above.
    """
    analysis = _tag("<|channel|>analysis<|message|>", {"type": "any_text"}, "<|end|>")
    preamble = _tag("<|channel|>commentary<|message|>", {"type": "any_text"}, "<|end|>")
    answers: list[dict[str, Any]] = []
    if plan.final == "json":
        answers.append(_sequence(
            _one_of([_const(f"<|channel|>final{kind}<|message|>") for kind in ("", " <|constrain|>json")]),
            {"type": "json_schema", "json_schema": plan.final_schema},
        ))
    elif plan.final == "text":
        answers.append(_sequence(_const("<|channel|>final<|message|>"), {"type": "any_text"}))
    calls = [_call_format(call) for call in plan.calls]
    call = _one_of(calls) if calls else None
    notes = [analysis] if plan.final == "json" else [analysis, preamble]

    def after(free: list[dict[str, Any]], answer: dict[str, Any]) -> dict[str, Any]:
        """`(free NEXT)* answer`: the answer alone, or free messages joined by NEXT, then NEXT and the answer."""
        messages = {"type": "tags_with_separator", "tags": free, "separator": _NEXT, "at_least_one": True}
        return _one_of([answer, _sequence(messages, _const(_NEXT), answer)])

    if plan.final == "json" and call is not None:
        body = _one_of([after([analysis], answers[0]), after([analysis, preamble], call)])
    else:
        body = after(notes, _one_of(answers + ([call] if call is not None else [])))
    return {"type": "structural_tag", "format": body}


def _call_format(call: _Call) -> dict[str, Any]:
    recipient = f" to={call.recipient}"
    headers = [
        _const(head + content_type + "<|message|>")
        for channel in _CHANNELS
        for head in (f"<|channel|>{channel}{recipient}", f"{recipient}<|channel|>{channel}")
        for content_type in _CONTENT_TYPES
    ]
    # `<|call|>` or nothing: an engine that counts <|call|> among its grammar's stop tokens cannot match it as text
    # (the structure ends and its stop tokens close it); one that does not writes it here.
    end = _one_of([_const("<|call|>"), _const("")])
    body: dict[str, Any] = {"type": "json_schema", "json_schema": call.schema}
    if call.freeform is not None:  # a Lark grammar has no structural-tag form: free text (OutputGrammar's gaps)
        body = call.freeform.structural_tag() or {"type": "any_text"}
    return _sequence(_one_of(headers), body, end)


def _tag(begin: str, content: dict[str, Any], end: str) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _sequence(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


def _one_of(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}
