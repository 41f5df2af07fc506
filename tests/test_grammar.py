"""Output grammars, compiled by real llguidance over the real vocabulary: they accept what gpt-oss really writes
when it satisfies the constraint, and reject every violation at the token that commits it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.vocab import Vocab
from proxy.engines.matcher import GrammarMatchers
from tests.grammars import session_matchers
from tools.definitions import FunctionTool, ResponseFormat, ToolChoice
from tools.grammar import OutputGrammar, output_grammar

# Recorded completions no constrained engine can produce: their reason.
MALFORMED = {
    "harmony_testdata_browser_search_commentary_code": "a call to an undeclared built-in tool",
    "harmony_test_missing_header_then_tool_call_json_no_constrain": "text with no header",
    "aldehir_garbage_no_header_then_call": "text with no header",
    "aldehir_unterminated_header_then_start": "a header with no <|message|>",
    "aldehir_garbage_header_ended_by_end": "text with no header",
    "aldehir_malformed_channel_name_colon": "a channel that does not exist",
    "aldehir_channel_header_without_message": "a header with no <|message|>",
    "aldehir_headerless_text_then_final": "text with no header",
    "sglang_channel_word_before_start": "a channel word outside a header",
    "bare_text_answer": "text with no header",
    "bare_single_letter": "text with no header",
    "python_recipient_skipped": "a call to an undeclared built-in tool",
    "browser_search_not_user_tool": "a call to an undeclared built-in tool",
    "implicit_end_by_channel": "a message with no <|end|>",
    "stray_special_tokens": "special tokens inside a message",
    # The parser reads a header that restates its channel (the later one decides); a grammar need not let the
    # model write one: it steers to the canonical header.
    "issue9_commentary_to_assistant_restated_as_analysis": "a header that repeats <|channel|>",
    "vllm32587_recipient_then_restated_commentary": "a header that repeats <|channel|>",
    "restated_channel_recipient_given_again": "a header that repeats <|channel|>",
    "restated_channel_analysis_then_final": "a header that repeats <|channel|>",
}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = FunctionTool("get_weather", "", WEATHER_SCHEMA)
TIME = FunctionTool("get_time", "", {"type": "object", "properties": {"tz": {"type": "string"}}})
ANSWER = ResponseFormat("answer", {"type": "object", "properties": {"issues": {"type": "array", "items": {
    "type": "string"}}, "count": {"type": "integer"}}, "required": ["issues", "count"], "additionalProperties": False})


@pytest.fixture(scope="module")
def matchers(vocab: Vocab) -> GrammarMatchers:
    return session_matchers(vocab)


def generated(vocab: Vocab, completion: str) -> list[int]:
    """The tokens an engine streams for this completion: up to its first stop token."""
    tokens = vocab.encode_harmony(completion)
    stop = next((i for i, token in enumerate(tokens) if token in vocab.stop_token_ids), len(tokens) - 1)
    return tokens[: stop + 1]


def rejected_at(matchers: GrammarMatchers, grammar: OutputGrammar | None, tokens: list[int]) -> int | None:
    """Where the grammar first refuses the completion (a token index; len(tokens) if the grammar is left
    unfinished), None if it accepts the whole completion. `<|return|>` is the tokenizer's EOS: allowed where the
    grammar is complete."""
    assert grammar is not None
    matcher = matchers.matcher(grammar)
    eos = matchers.vocab.special.return_
    body = tokens[:-1] if tokens and tokens[-1] == eos else tokens
    consumed = matcher.try_consume_tokens(body)
    if consumed < len(body):
        return consumed
    if tokens[-1] == eos:
        mask = matcher.compute_bitmask()
        return None if mask[eos >> 3] >> (eos & 7) & 1 else len(body)
    return None if matcher.is_accepting() else len(tokens)


def strict_schema_of(value: dict[str, Any]) -> dict[str, Any]:
    """A strict schema the recorded arguments satisfy: every property required, with the type it has."""
    kinds = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}
    return {"type": "object", "properties": {key: {"type": kinds[type(item)]} for key, item in value.items()},
            "required": list(value), "additionalProperties": False}


def test_recorded_completions_that_satisfy_a_constraint_are_accepted(
    vocab: Vocab, recorded: list[dict[str, Any]], matchers: GrammarMatchers
) -> None:
    checked = 0
    for entry in recorded:
        tokens, expected = generated(vocab, entry["completion"]), entry["expected"]
        if tokens[-1] not in vocab.stop_token_ids or len(expected["tool_calls"]) > 1:
            continue  # cut off, or several calls: one completion holds one call (its first)
        if expected["tool_calls"]:
            call = expected["tool_calls"][0]
            try:
                arguments = json.loads(call["arguments"])
            except json.JSONDecodeError:
                continue
            tool = FunctionTool(call["name"], "", strict_schema_of(arguments), strict=True)
            grammars = [output_grammar([tool, TIME], ToolChoice("required"), None),
                        output_grammar([TIME, tool], ToolChoice("function", call["name"]), None),
                        output_grammar([tool], ToolChoice("auto"), None)]
        else:
            grammars = [output_grammar([FunctionTool("get_weather", "", WEATHER_SCHEMA, True)], ToolChoice("auto"),
                                       None)]
            if (expected["content"] or "").startswith("{"):
                grammars.append(output_grammar([], ToolChoice("auto"), ResponseFormat(
                    "json_object", {"type": "object"}, kind="json_object")))
        for grammar in grammars:
            position = rejected_at(matchers, grammar, tokens)
            if entry["name"] in MALFORMED:
                assert position is not None, entry["name"]
            else:
                assert position is None, (entry["name"], grammar.summary, vocab.decode(tokens[: (position or 0) + 1]))
                checked += 1
    assert checked >= 40


PROSE = ("<|channel|>analysis<|message|>Sunny, surely.<|end|><|start|>assistant<|channel|>final<|message|>"
         "Sunny.<|return|>")


def call(name: str, arguments: str, analysis: str = "Need the tool.") -> str:
    return (f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant<|channel|>commentary "
            f"to=functions.{name} <|constrain|>json<|message|>{arguments}<|call|>")


def final(body: str, preamble: str = "") -> str:
    head = f"<|channel|>commentary<|message|>{preamble}<|end|><|start|>assistant" if preamble else ""
    return (f"{head}<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>final<|message|>"
            f"{body}<|return|>")


@pytest.mark.parametrize(("completion", "where"), [
    (PROSE, "final"),  # prose when a call is required
    (call("get_time", '{"tz":"CET"}'), " to=functions.get_"),  # a call to another tool
    (call("get_weather", '{"unit":"C"}'), '{"'),  # arguments missing a required property
    (call("get_weather", '{"city":3}'), '{"city":'),  # a wrong type
    (call("get_weather", '{"city":"Paris","wind":true}'), '{"city":"Paris"'),  # a property not declared
    (call("get_weather", '{"city":"Paris","unit":"K"}'), '{"city":"Paris","unit":"'),  # not in the enum
    (call("get_weather", '{"query":"x"}').replace("functions.get_weather", "browser.search"), " to="),  # built-in
    ("<|channel|>analysis<|message|>Think<|return|>", "Think"),  # the turn ends inside the analysis
])
def test_a_required_call_rejects_violations(vocab: Vocab, matchers: GrammarMatchers, completion: str,
                                            where: str) -> None:
    grammar = output_grammar([WEATHER], ToolChoice("function", "get_weather"), None)
    tokens = generated(vocab, completion)
    position = rejected_at(matchers, grammar, tokens)
    assert position is not None
    # Refused at the token that commits the violation: not before it starts, not after it.
    prefix = vocab.decode(tokens[:position])
    assert completion.index(where) - 12 <= len(prefix) <= completion.index(where) + len(where) + 4, prefix


@pytest.mark.parametrize("completion", [
    final("The issues are: none."),  # not JSON
    final('{"issues":[]}'),  # a required field missing
    final('{"issues":[1],"count":1}'),  # a wrong item type
    final('{"issues":[],"count":0}', preamble="Here it is:"),  # a preamble would land inside the JSON content
    call("get_weather", '{"city":"Paris"}'),  # no tools under tool_choice none
])
def test_a_json_schema_final_rejects_violations(vocab: Vocab, matchers: GrammarMatchers, completion: str) -> None:
    grammar = output_grammar([], ToolChoice("none"), ANSWER)
    assert rejected_at(matchers, grammar, generated(vocab, completion)) is not None


def test_a_json_schema_final_accepts_json_and_leaves_analysis_free(vocab: Vocab, matchers: GrammarMatchers) -> None:
    grammar = output_grammar([], ToolChoice("auto"), ANSWER)
    for body in ('{"issues":[],"count":0}', '{"issues": ["a", "b"], "count": 2}',
                 '{\n  "issues": [],\n  "count": 0\n}'):
        assert rejected_at(matchers, grammar, generated(vocab, final(body))) is None, body
    wild = vocab.encode("Anything: {not json} <|end|> spelled out as text, ünïcode.\n")  # the model's own text
    tokens = (vocab.encode_harmony("<|channel|>analysis<|message|>") + wild + [vocab.special.end]
              + generated(vocab, "<|start|>assistant" + final('{"issues":[],"count":1}')))
    assert rejected_at(matchers, grammar, tokens) is None


def test_json_object_accepts_any_object_only(vocab: Vocab, matchers: GrammarMatchers) -> None:
    grammar = output_grammar([], ToolChoice("auto"), ResponseFormat("json_object", {"type": "object"},
                                                                    kind="json_object"))
    assert rejected_at(matchers, grammar, generated(vocab, final('{"anything": [1, {"x": null}]}'))) is None
    for body in ("[1, 2]", '"text"', "plain words"):
        assert rejected_at(matchers, grammar, generated(vocab, final(body))) is not None


def test_strict_tools_under_auto(vocab: Vocab, matchers: GrammarMatchers) -> None:
    strict = FunctionTool("get_weather", "", WEATHER_SCHEMA, strict=True)
    grammar = output_grammar([strict, TIME], ToolChoice("auto"), None)
    assert grammar is not None and "strict arguments for get_weather" in grammar.summary
    accepted = [call("get_weather", '{"city":"Paris"}'), call("get_time", '{"whatever": [1]}'),
                final("Plain words, no call."), final("Words.", preamble="Checking.")]
    for completion in accepted:
        assert rejected_at(matchers, grammar, generated(vocab, completion)) is None, completion
    for completion in (call("get_weather", '{"city":1}'), call("get_weather", '{}'),
                       call("x", "{}").replace("functions.x", "python")):
        assert rejected_at(matchers, grammar, generated(vocab, completion)) is not None, completion


def test_nothing_constrained_is_no_grammar() -> None:
    assert output_grammar([WEATHER, TIME], ToolChoice("auto"), None) is None
    assert output_grammar([WEATHER], ToolChoice("none"), None) is None
    assert output_grammar([], ToolChoice("auto"), None) is None


def test_equal_constraints_have_equal_keys_and_compile_once(matchers: GrammarMatchers) -> None:
    first = output_grammar([WEATHER], ToolChoice("required"), None)
    again = output_grammar([FunctionTool("get_weather", "", dict(WEATHER_SCHEMA))], ToolChoice("required"), None)
    other = output_grammar([WEATHER, TIME], ToolChoice("required"), None)
    assert first is not None and again is not None and other is not None
    assert first.key == again.key and first.key != other.key
    before = matchers.stats()
    matchers.matcher(first)
    matchers.matcher(again)
    after = matchers.stats()
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 1


def test_parallel_tool_calls_do_not_change_the_grammar() -> None:
    # gpt-oss writes one call per completion: <|call|> is a stop token either way.
    assert output_grammar([WEATHER], ToolChoice("required"), None, parallel_tool_calls=False) == output_grammar(
        [WEATHER], ToolChoice("required"), None, parallel_tool_calls=True)


def test_structural_tag_mirrors_the_lark_grammar() -> None:
    grammar = output_grammar([WEATHER, TIME], ToolChoice("required"), None)
    assert grammar is not None and grammar.structural_tag["type"] == "structural_tag"
    text = json.dumps(grammar.structural_tag)
    for piece in ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                  " to=functions.get_time<|channel|>commentary json<|message|>",
                  '"tags_with_separator"', '"separator": "<|start|>assistant"', '"<|call|>"'):
        assert piece in text
    assert json.dumps(WEATHER_SCHEMA) in text  # the schema as given (no llguidance options)
    assert "final" not in text  # no final answer when a call is required


def test_all_harmony_specials_stay_out_of_free_text(vocab: Vocab, matchers: GrammarMatchers) -> None:
    grammar = output_grammar([WEATHER], ToolChoice("required"), None)
    assert grammar is not None
    matcher = matchers.matcher(grammar)
    assert matcher.try_consume_tokens(vocab.encode_harmony("<|channel|>analysis<|message|>Text")) == 4
    mask = matcher.compute_bitmask()
    allowed = {token for token in range(vocab.text_token_count, vocab.vocab_size)
               if mask[token >> 3] >> (token & 7) & 1}
    assert allowed == {vocab.special.end}


# Schemas and values valid against them, generated together: the accept side for any schema shape.
_NAMES = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_LEAVES = st.one_of(
    # No raw U+007F: JSON allows it unescaped, llguidance 1.9 does not (gpt-oss does not write it either).
    st.tuples(st.just({"type": "string"}), st.text(st.characters(exclude_characters="\x7f"), max_size=12)),
    st.tuples(st.just({"type": "integer"}), st.integers(-10**6, 10**6)),
    st.tuples(st.just({"type": "number"}), st.floats(-1e6, 1e6, allow_nan=False)),
    st.tuples(st.just({"type": "boolean"}), st.booleans()),
    st.tuples(st.just({"type": "null"}), st.none()),
    st.lists(_NAMES, min_size=1, max_size=4, unique=True).flatmap(
        lambda options: st.tuples(st.just({"enum": options}), st.sampled_from(options))),
)


def _objects(children: st.SearchStrategy[tuple[dict[str, Any], Any]]) -> st.SearchStrategy[tuple[dict[str, Any], Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[dict[str, Any], Any]:
        fields = draw(st.dictionaries(_NAMES, children, max_size=4))
        present = [name for name in fields if draw(st.booleans())]
        schema = {"type": "object", "properties": {name: sub for name, (sub, _) in fields.items()},
                  "required": present, "additionalProperties": False}
        return schema, {name: fields[name][1] for name in present}
    arrays = children.flatmap(lambda pair: st.tuples(st.just({"type": "array", "items": pair[0]}),
                                                     st.lists(st.just(pair[1]), max_size=3)))
    nullable = children.map(lambda pair: ({"anyOf": [pair[0], {"type": "null"}]}, pair[1]))
    return st.one_of(build(), arrays, nullable)


SCHEMA_AND_VALUE = _objects(st.recursive(_LEAVES, _objects, max_leaves=6)).filter(
    lambda pair: pair[0].get("type") == "object")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEMA_AND_VALUE, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_generated_schemas_accept_their_valid_values(vocab: Vocab, matchers: GrammarMatchers,
                                                     pair: tuple[dict[str, Any], Any],
                                                     separators: tuple[str, str]) -> None:
    schema, value = pair
    jsonschema.validate(value, schema)  # the generator's own check
    text = json.dumps(value, separators=separators, ensure_ascii=False)
    tool = FunctionTool("f", "", schema, strict=True)
    required = output_grammar([tool], ToolChoice("required"), None)
    assert rejected_at(matchers, required, generated(vocab, call("f", text))) is None, text
    answer = output_grammar([], ToolChoice("auto"), ResponseFormat("x", schema, strict=True))
    assert rejected_at(matchers, answer, generated(vocab, final(text))) is None, text
