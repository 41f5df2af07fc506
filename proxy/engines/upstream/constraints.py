"""Output constraints on the way to an upstream server: which request field carries them, in which grammar dialect.

It depends on the upstream's flavor and on how it was started (`--upstream-guided-decoding`): its grammar backend,
and whether it applies the grammar from the first generated token or only after the reasoning. What a flavor cannot
carry is said once at start-up and for each constrained request, never dropped silently.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from proxy.engines.base import OutputConstraint
from tools.grammar import OutputGrammar

# How the upstream enforces output constraints, which depends on how it was started (`--upstream-guided-decoding`):
# its grammar backend, and whether it applies the grammar from the first generated token or only after the
# reasoning (vLLM sets a gpt-oss reasoning parser on its own; in 0.32 it lets the grammar apply from the first token, so
# `final-json` there makes the whole completion the bare JSON answer, with no reasoning).
GUIDED_DECODING = ("xgrammar", "llguidance", "final-json", "none")
DEFAULT_GUIDED_DECODING = {"vllm": "final-json", "sglang": "xgrammar", "trtllm": "xgrammar", "dynamo": "final-json"}

Fields = dict[str, Any]
# The whole completion's grammar: (where it goes, for messages; how). Dynamo has no field for a structural tag.
_WHOLE: dict[tuple[str, str], tuple[str, Callable[[OutputGrammar], Fields]]] = {
    ("vllm", "xgrammar"): ("structured_outputs.structural_tag",
                           lambda g: {"structured_outputs": {"structural_tag": json.dumps(g.structural_tag)}}),
    ("vllm", "llguidance"): ("structured_outputs.grammar", lambda g: {"structured_outputs": {"grammar": g.lark}}),
    ("sglang", "xgrammar"): ("response_format (structural tag)", lambda g: {"response_format": g.structural_tag}),
    ("sglang", "llguidance"): ("ebnf", lambda g: {"ebnf": g.lark}),
    ("trtllm", "xgrammar"): ("response_format (structural tag)", lambda g: {"response_format": g.structural_tag}),
    ("trtllm", "llguidance"): ("response_format (ebnf)",
                               lambda g: {"response_format": {"type": "ebnf", "ebnf": g.lark}}),
    ("dynamo", "llguidance"): ("guided_grammar", lambda g: {"guided_grammar": g.lark}),
}
# Only the final answer's JSON Schema, for an upstream that applies it after the reasoning.
_FINAL_JSON: dict[str, tuple[str, Callable[[dict[str, Any]], Fields]]] = {
    "vllm": ("structured_outputs.json", lambda schema: {"structured_outputs": {"json": schema}}),
    "sglang": ("json_schema", lambda schema: {"json_schema": json.dumps(schema)}),
    "trtllm": ("response_format (json)", lambda schema: {"response_format": {"type": "json", "schema": schema}}),
    "dynamo": ("guided_json", lambda schema: {"guided_json": schema}),
}
# What the upstream needs for a whole-completion grammar, for the start-up message.
_NEEDS = {
    ("vllm", "xgrammar"): "a vLLM started with --structured-outputs-config.backend xgrammar (a vLLM process runs one "
                          "grammar backend, which `auto` picks from its first constrained request; vLLM 0.32 applies "
                          "the grammar from the first token, releases whose gpt-oss reasoning parser holds it back "
                          "until the final channel also need --structured-outputs-config.enable_in_reasoning=true)",
    ("vllm", "llguidance"): "a vLLM started with --structured-outputs-config.backend guidance (a vLLM process runs one "
                            "grammar backend, which `auto` picks from its first constrained request; vLLM 0.32 applies "
                            "the grammar from the first token, releases whose gpt-oss reasoning parser holds it back "
                            "until the final channel also need --structured-outputs-config.enable_in_reasoning=true)",
    ("sglang", "xgrammar"): "an SGLang started with --grammar-backend xgrammar (its default) and no --reasoning-parser",
    ("sglang", "llguidance"): "an SGLang started with --grammar-backend llguidance and no --reasoning-parser",
    ("trtllm", "xgrammar"): "a trtllm-serve started with `guided_decoding_backend: xgrammar` in its "
                            "--extra_llm_api_options YAML",
    ("trtllm", "llguidance"): "a trtllm-serve started with `guided_decoding_backend: llguidance` in its "
                              "--extra_llm_api_options YAML",
    ("dynamo", "llguidance"): "Dynamo workers whose grammar backend is llguidance and applies from the first token "
                              "(TensorRT-LLM workers with --guided-decoding-backend llguidance)",
}


class GuidedDecoding:
    """The request fields that carry an output constraint to one upstream, in the dialect its grammar backend takes;
    what they cannot carry is said once at start-up (`notice`) and for each constrained request (`fields`)."""

    def __init__(self, flavor: str, mode: str | None = None) -> None:
        self.flavor = flavor
        self.mode = mode or DEFAULT_GUIDED_DECODING[flavor]
        if self.mode not in GUIDED_DECODING:
            raise ValueError(f"unknown guided decoding mode {self.mode!r}: use one of {', '.join(GUIDED_DECODING)}")
        self._whole = _WHOLE.get((flavor, self.mode))
        self._final = _FINAL_JSON[flavor] if self.mode == "final-json" else None
        self.label = f"{flavor}, --upstream-guided-decoding {self.mode}"

    def fields(self, constraint: OutputConstraint) -> tuple[Fields, str]:
        """The fields that carry `constraint`, and what they leave unenforced ('' when nothing)."""
        grammar = constraint.grammar
        if grammar is None:
            return {}, ""
        if self._whole is not None:  # an xgrammar structural tag cannot carry a custom tool's Lark grammar
            return self._whole[1](grammar), grammar.structural_tag_gaps if self.mode == "xgrammar" else ""
        if self._final is not None and constraint.response_format is not None:
            return self._final[1](constraint.response_format.schema), _tool_constraints(constraint)
        return {}, grammar.summary

    def notice(self) -> tuple[int, str]:
        """The start-up message (log level, text): where constraints go, and what the upstream must run with."""
        if self._whole is not None:
            return logging.INFO, (f"output constraints go to the upstream ({self.label}) as the whole completion's "
                                  f"grammar in `{self._whole[0]}`; this needs {_NEEDS[self.flavor, self.mode]}")
        if self._final is not None:
            better = next(mode for mode in ("xgrammar", "llguidance") if (self.flavor, mode) in _WHOLE)
            return logging.WARNING, (
                f"the upstream ({self.label}) is sent only the final answer's JSON Schema, in `{self._final[0]}`: "
                "required and named tool calls and strict tool arguments are NOT enforced (each such request is "
                f"logged); to enforce them too, use {_NEEDS[self.flavor, better]}, and pass "
                f"--upstream-guided-decoding {better}")
        why = "" if self.mode == "none" else f", whose requests have no field for a {self.mode} grammar"
        return logging.WARNING, (
            f"output constraints (tool_choice required or named, strict tools, response_format) are NOT sent to the "
            f"upstream ({self.label}{why}): they are only described to the model, not enforced; each constrained "
            "request is logged")


def _tool_constraints(constraint: OutputConstraint) -> str:
    """The parts of a constraint that a final-answer JSON Schema does not carry ('' when none)."""
    choice = constraint.tool_choice
    if choice.mode == "none":
        return ""
    parts = []
    if choice.mode == "required":
        parts.append("a required tool call")
    elif choice.names_tool:
        parts.append(f"a required call to {choice.name}")
    strict = [tool.name for tool in constraint.tools if tool.strict]
    if strict:
        parts.append("strict arguments for " + ", ".join(strict))
    return "; ".join(parts)
