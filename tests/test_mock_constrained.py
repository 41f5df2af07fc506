"""The mock engine generates under the output grammar (real llguidance masks), and requests whose schemas cannot
be enforced are refused with OpenAI-shaped 400s."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import pytest

from parsers.conversation import Prompt, ToolResult, UserMessage
from parsers.items import ItemCollector
from parsers.render import Renderer
from parsers.stream import OutputParser
from parsers.vocab import Vocab
from proxy.chat.request import parse_chat_request
from proxy.engines.base import GenerationRequest, OutputConstraint, SamplingParams, Step
from proxy.engines.mock import MockModel, mock_engine
from proxy.errors import APIError
from proxy.responses.request.parse import parse_responses_request
from tests.conftest import MODEL, LiveServer
from tests.grammars import session_matchers
from tools.arguments import example_arguments
from tools.definitions import FunctionTool, ResponseFormat, ToolChoice

CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
REPORT = {  # what pydantic writes for nested models: $defs, $ref, anyOf with null, enums
    "type": "object", "additionalProperties": False, "required": ["title", "steps", "owner"],
    "properties": {"title": {"type": "string"}, "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
                   "owner": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]}},
    "$defs": {"Step": {"type": "object", "additionalProperties": False, "required": ["n", "kind"],
                       "properties": {"n": {"type": "integer", "minimum": 1}, "kind": {"enum": ["do", "check"]}}},
              "Person": {"type": "object", "additionalProperties": False, "required": ["name"],
                         "properties": {"name": {"type": "string", "minLength": 2}}}},
}


def run(vocab: Vocab, prompt: Prompt, constraint: OutputConstraint) -> tuple[list[int], list[tuple[Any, ...]], str]:
    """Generate through the mock engine (as the server does): the tokens, the parsed items, the finish reason."""
    request = GenerationRequest("r", Renderer(vocab).render(prompt), SamplingParams(
        max_tokens=4000, stop_token_ids=vocab.stop_token_ids), constraint)

    async def collect() -> list[Step]:
        return [step async for step in mock_engine(vocab, matchers=session_matchers(vocab)).generate(request)]

    steps = asyncio.run(collect())
    tokens = [token for step in steps for token in step.token_ids]
    parser, collector = OutputParser(vocab), ItemCollector()
    collector.add(parser.feed(tokens))
    collector.add(parser.finish())
    return tokens, collector.summary(), steps[-1].finish_reason or ""


def accepted(vocab: Vocab, constraint: OutputConstraint, tokens: list[int]) -> bool:
    """A fresh matcher of the same grammar takes every token (the final <|return|> as EOS)."""
    assert constraint.grammar is not None
    matcher = session_matchers(vocab).matcher(constraint.grammar)
    body = tokens[:-1] if tokens[-1] == vocab.special.return_ else tokens
    return matcher.try_consume_tokens(body) == len(body) and matcher.is_accepting()


def test_a_required_call_is_generated_under_the_grammar(vocab: Vocab) -> None:
    tools = (FunctionTool("get_weather", "", WEATHER), FunctionTool("lookup_code", "", CODE))
    constraint = OutputConstraint(tools, ToolChoice("required"))
    tokens, items, finish = run(vocab, Prompt([UserMessage("hello")], list(tools)), constraint)
    assert [kind for kind, *_ in items] == ["reasoning", "tool_call"] and finish == "stop"
    assert items[1][1] == "get_weather" and tokens[-1] == vocab.special.call
    jsonschema.validate(json.loads(items[1][2]), WEATHER)
    assert accepted(vocab, constraint, tokens)


def test_the_mask_repairs_arguments_the_mock_cannot_make_valid(vocab: Vocab) -> None:
    with pytest.raises(jsonschema.ValidationError):  # the mock's own example misses the pattern ...
        jsonschema.validate(example_arguments(CODE), CODE)
    tools = (FunctionTool("get_weather", "", WEATHER), FunctionTool("lookup_code", "", CODE))
    constraint = OutputConstraint(tools, ToolChoice("function", "lookup_code"))
    tokens, items, _ = run(vocab, Prompt([UserMessage("use get_weather")], list(tools)), constraint)
    assert items[-1][:2] == ("tool_call", "lookup_code")  # the named tool, though the user named another
    jsonschema.validate(json.loads(items[-1][2]), CODE)  # ... the grammar's mask made it valid
    assert accepted(vocab, constraint, tokens)


@pytest.mark.parametrize("strict", [True, False])
def test_a_json_schema_answer_is_valid_json(vocab: Vocab, strict: bool) -> None:
    answer = ResponseFormat("report", REPORT, strict=strict)
    constraint = OutputConstraint((), ToolChoice("auto"), answer)
    tokens, items, finish = run(vocab, Prompt([UserMessage("plan it")], [], response_format=answer), constraint)
    assert [kind for kind, *_ in items] == ["reasoning", "final"] and finish == "stop"
    jsonschema.validate(json.loads(items[1][2]), REPORT)
    assert tokens[-1] == vocab.special.return_ and accepted(vocab, constraint, tokens)


def test_json_object_and_a_tool_result_summary_are_json(vocab: Vocab) -> None:
    answer = ResponseFormat("json_object", {"type": "object"}, kind="json_object")
    tools = (FunctionTool("lookup", "", {"type": "object"}),)
    prompt = Prompt([UserMessage("go"), ToolResult("c", "lookup", "42 apples")], list(tools), response_format=answer)
    constraint = OutputConstraint(tools, ToolChoice("auto"), answer)
    tokens, items, _ = run(vocab, prompt, constraint)
    content = json.loads(items[-1][2])
    assert isinstance(content, dict) and "42 apples" in content["answer"]
    assert accepted(vocab, constraint, tokens)


def test_strict_tools_under_auto(vocab: Vocab) -> None:
    tools = (FunctionTool("lookup_code", "", CODE, strict=True), FunctionTool("get_weather", "", WEATHER))
    constraint = OutputConstraint(tools, ToolChoice("auto"))
    tokens, items, _ = run(vocab, Prompt([UserMessage("please lookup_code")], list(tools)), constraint)
    assert items[-1][:2] == ("tool_call", "lookup_code")
    jsonschema.validate(json.loads(items[-1][2]), CODE)
    assert accepted(vocab, constraint, tokens)
    _, items, _ = run(vocab, Prompt([UserMessage("just chat")], list(tools)), constraint)
    assert items[-1][0] == "final" and "mock" in items[-1][2]  # the model may still answer


def test_constrained_generation_is_deterministic_and_fast(vocab: Vocab) -> None:
    tools = (FunctionTool("get_weather", "", WEATHER),)
    constraint = OutputConstraint(tools, ToolChoice("required"))
    request = GenerationRequest("r", Renderer(vocab).render(Prompt([UserMessage("hi")], list(tools))),
                                SamplingParams(max_tokens=500), constraint)
    model = MockModel(vocab)
    first = model.write(request)  # compiles (the tokenizer may be built here too)
    started = time.process_time()  # CPU time: a busy machine does not stretch it
    again = model.write(request)
    assert again == first and time.process_time() - started < 0.25


# Request checks: what cannot be enforced is refused, naming the offending field and keyword.

def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def tool(parameters: dict[str, Any], strict: bool | None = None) -> list[dict[str, Any]]:
    function: dict[str, Any] = {"name": "f", "parameters": parameters}
    if strict is not None:
        function["strict"] = strict
    return [{"type": "function", "function": function}]


def refusal(parse: Callable[[], Any]) -> APIError:
    with pytest.raises(APIError) as caught:
        parse()
    assert caught.value.status == 400
    return caught.value


MISSING_REF = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}
NOT = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
UNIQUE = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}


def test_a_ref_to_nothing_is_a_400_naming_it() -> None:
    for strict in (None, True):
        error = refusal(lambda strict=strict: parse_chat_request(chat(tools=tool(MISSING_REF, strict)), "low"))
        assert error.param == "tools[0].function.parameters" and "#/$defs/Nope" in error.message
    error = refusal(lambda: parse_chat_request(chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": MISSING_REF}}), "low"))
    assert error.param == "response_format.json_schema.schema" and "#/$defs/Nope" in error.message
    remote = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    assert "example.com" in refusal(lambda: parse_chat_request(chat(tools=tool(remote)), "low")).message


def test_strict_schemas_with_keywords_that_cannot_be_enforced_are_400s() -> None:
    error = refusal(lambda: parse_chat_request(chat(tools=tool(NOT, strict=True)), "low"))
    assert error.param == "tools[0].function.parameters" and '"not"' in error.message
    error = refusal(lambda: parse_chat_request(chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": UNIQUE, "strict": True}}), "low"))
    assert error.param == "response_format.json_schema.schema" and "uniqueItems" in error.message
    error = refusal(lambda: parse_responses_request({"model": MODEL, "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": UNIQUE, "strict": True}}}, "low", MODEL))
    assert error.param == "text.format.schema" and "uniqueItems" in error.message
    error = refusal(lambda: parse_responses_request({"model": MODEL, "input": "hi", "tools": [{
        "type": "function", "name": "f", "parameters": {"type": "string", "pattern": "(?=a)"}, "strict": True}]},
        "low", MODEL))
    assert error.param == "tools[0].parameters" and "look-around" in error.message


def test_without_strict_the_same_schemas_are_enforced_as_far_as_possible(vocab: Vocab,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    request = parse_chat_request(chat(tools=tool(NOT), tool_choice="required", response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": UNIQUE}}), "low")
    assert request.constraint.response_format is not None and not request.constraint.response_format.strict
    with caplog.at_level("WARNING", logger="harmony_proxy.grammar"):
        grammar = request.constraint.grammar
    assert grammar is not None and '"lenient":true' in grammar.lark
    assert any('"not"' in record.getMessage() for record in caplog.records)  # the relaxation is logged
    assert session_matchers(vocab).matcher(grammar) is not None  # and the grammar compiles


def test_parallel_tool_calls_reach_the_constraint() -> None:
    request = parse_chat_request(chat(tools=tool(WEATHER), parallel_tool_calls=False), "low")
    assert request.constraint.parallel_tool_calls is False
    responses = parse_responses_request({"model": MODEL, "input": "hi", "parallel_tool_calls": False}, "low", MODEL)
    assert responses.constraint().parallel_tool_calls is False


def test_structured_outputs_over_http(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    response_format = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
    reply = httpx.post(server.base_url + "/v1/chat/completions", json=chat(response_format=response_format),
                       timeout=60).json()
    jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), REPORT)
    reply = httpx.post(server.base_url + "/v1/responses", timeout=60, json={
        "model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "lookup_code", "parameters": CODE,
                                                   "strict": True}], "tool_choice": "required"}).json()
    call = next(item for item in reply["output"] if item["type"] == "function_call")
    jsonschema.validate(json.loads(call["arguments"]), CODE)
    refused = httpx.post(server.base_url + "/v1/chat/completions", json=chat(tools=tool(NOT, strict=True)), timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools[0].function.parameters"
