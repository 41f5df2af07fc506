"""Cost of output constraints: building and compiling a Harmony grammar, and masking each generated token.

    .venv/bin/python benchmarks/grammar_bench.py [--repeat N]

For each constraint (a required call to one small tool, a required call among 20 tools, a nested pydantic-style
response format, a wide flat response format) it prints, in milliseconds:
- build: `output_grammar` (Lark text and structural tag, from the request's tools and format);
- compile cold: llguidance compiling that grammar (what the first request with these tools pays, off the loop);
- cached: the copy a later request with the same tools gets from the compile cache;
- json-only: the baseline, llguidance compiling the bare JSON Schema, as a server that constrains the whole
  output to JSON (no reasoning, no Harmony) would; ratio = compile cold / json-only;
and per generated token, in microseconds: computing the mask and consuming the token through a real completion
(reasoning, then the constrained part), next to the same for the bare JSON-only matcher over the JSON tokens.
The llguidance tokenizer is built once first (its time is printed); it is not part of any figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llguidance

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from parsers.vocab import Vocab, load_vocab
from proxy.engines.matcher import GrammarMatchers
from tools.arguments import example_arguments
from tools.definitions import FunctionTool, ResponseFormat, ToolChoice
from tools.grammar import OutputGrammar, output_grammar

REASONING = "The user wants this; I will answer in the required form. " * 8

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
PLAN = {
    "type": "object", "additionalProperties": False, "required": ["title", "steps", "owner"],
    "properties": {"title": {"type": "string"}, "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
                   "owner": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]}},
    "$defs": {"Step": {"type": "object", "additionalProperties": False, "required": ["n", "kind"],
                       "properties": {"n": {"type": "integer"}, "kind": {"enum": ["do", "check"]}}},
              "Person": {"type": "object", "additionalProperties": False, "required": ["name"],
                         "properties": {"name": {"type": "string"}}}},
}
WIDE = {"type": "object", "additionalProperties": False, "required": [f"field_{i}" for i in range(60)],
        "properties": {f"field_{i}": {"type": ["string", "integer", "boolean"][i % 3]} for i in range(60)}}


def tool(name: str, schema: dict[str, Any]) -> FunctionTool:
    return FunctionTool(name, f"The {name} tool.", schema, strict=True)


def cases() -> list[tuple[str, tuple[FunctionTool, ...], ToolChoice, ResponseFormat | None, dict[str, Any]]]:
    """(name, tools, tool_choice, response_format, the schema of the constrained JSON)."""
    many = tuple(tool(f"tool_{i}", {**WEATHER,
                                    "properties": {**WEATHER["properties"], f"extra_{i}": {"type": "integer"}}})
                 for i in range(19)) + (tool("get_weather", WEATHER),)
    return [
        ("required call, 1 tool", (tool("get_weather", WEATHER),), ToolChoice("required"), None, WEATHER),
        ("required call among 20 tools", many, ToolChoice("required"), None, WEATHER),
        ("named call, 20 tools", many, ToolChoice("function", "get_weather"), None, WEATHER),
        ("json_schema, nested $defs", (), ToolChoice("auto"), ResponseFormat("plan", PLAN, strict=True), PLAN),
        ("json_schema, 60 fields", (), ToolChoice("auto"), ResponseFormat("wide", WIDE, strict=True), WIDE),
    ]


def completion(
    vocab: Vocab, grammar: OutputGrammar, schema: dict[str, Any], call: str | None,
) -> tuple[list[int], list[int]]:
    """A completion the grammar accepts, and its JSON part's tokens."""
    body = vocab.encode(json.dumps(example_arguments(schema), separators=(",", ":")))
    head = vocab.encode_harmony(f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant")
    if call is not None:
        tail = vocab.encode_harmony(f"<|channel|>commentary to=functions.{call} <|constrain|>json<|message|>")
        return head + tail + body + vocab.encode_harmony("<|call|>"), body
    return head + vocab.encode_harmony("<|channel|>final<|message|>") + body, body


def best_ms(function: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def mask_us_per_token(matcher: llguidance.LLMatcher, tokens: list[int]) -> float:
    start = time.perf_counter()
    for token in tokens:
        matcher.compute_bitmask()
        if not matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused its own example: {matcher.get_error()}")
    return (time.perf_counter() - start) / len(tokens) * 1e6


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--repeat", type=int, default=5)
    args = options.parse_args()
    vocab = load_vocab()
    start = time.perf_counter()
    tokenizer = GrammarMatchers(vocab).tokenizer()
    print(f"llguidance tokenizer built once in {time.perf_counter() - start:.2f} s\n")
    print(f"{'constraint':29} {'build':>7} {'compile':>8} {'cached':>7} {'json-only':>9} {'ratio':>6}"
          f" {'mask us/tok':>11} {'json-only':>9}")
    for name, tools, choice, format_, schema in cases():
        grammar = output_grammar(tools, choice, format_)
        assert grammar is not None
        build = best_ms(lambda: output_grammar(tools, choice, format_), args.repeat)  # noqa: B023

        def cold() -> None:
            GrammarMatchers(vocab, tokenizer=tokenizer).matcher(grammar)  # noqa: B023  (only the compile is timed)

        warm = GrammarMatchers(vocab, tokenizer=tokenizer)
        warm.matcher(grammar)
        compile_cold = best_ms(cold, args.repeat)
        cached = best_ms(lambda: warm.matcher(grammar), args.repeat)  # noqa: B023
        bare = json.dumps(schema)
        json_only = best_ms(lambda: llguidance.LLMatcher(
            tokenizer, llguidance.LLMatcher.grammar_from_json_schema(bare)), args.repeat)  # noqa: B023
        tokens, body = completion(vocab, grammar, schema, "get_weather" if format_ is None else None)
        masks = [mask_us_per_token(warm.matcher(grammar), tokens) for _ in range(args.repeat)]
        bare_masks = [mask_us_per_token(llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(
            bare)), body) for _ in range(args.repeat)]
        print(f"{name:29} {build:7.2f} {compile_cold:8.2f} {cached:7.3f} {json_only:9.2f} "
              f"{compile_cold / json_only:6.2f} {statistics.median(masks):11.1f} {statistics.median(bare_masks):9.1f}")
    print("\nms, best of --repeat; mask: median over --repeat walks of a whole completion "
          f"({len(REASONING.split())}-word reasoning, then the constrained JSON).")


if __name__ == "__main__":
    main()
