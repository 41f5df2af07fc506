"""Custom (freeform) tools: input the model writes as raw text, free or held to a Lark grammar or a regex.

The model calls one as it calls a function, `to=functions.apply_patch` (or `to=NS.name` in a namespace), but writes
the input itself as the message, not JSON. The declaration says so, with the grammar as `//` lines, and where the
engine enforces output grammars the call's body is held to it: the whole completion's Lark grammar (tools/grammar.py)
takes the tool's Lark grammar as a nested `%lark { ... }` block, and a regex as a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

import llguidance

from tools.rust_text import rust_lines

SYNTAXES = ("lark", "regex")
MAX_DEFINITION_CHARS = 64 * 1024


@dataclass(frozen=True)
class Freeform:
    """A custom tool's input format: `syntax` "text" (anything), "lark" or "regex" with its `definition`."""

    syntax: str = "text"
    definition: str = ""

    @property
    def constrained(self) -> bool:
        return self.syntax != "text"

    def lark_rule(self) -> str:
        """The right-hand side of the rule for the call's body, in llguidance's Lark."""
        if self.syntax == "lark":
            return "%lark {\n" + self.definition + "\n}"
        if self.syntax == "regex":
            return "/" + _lark_regex(self.definition) + "/"
        return "/(.|\\n)*/"

    def structural_tag(self) -> dict[str, object] | None:
        """The body in xgrammar's structural-tag formats; None where it has none (a Lark grammar: not enforced)."""
        if self.syntax == "regex":
            return {"type": "regex", "pattern": self.definition}
        if self.syntax == "text":
            return {"type": "any_text"}
        return None


def format_error(syntax: object, definition: object) -> str | None:
    """Why a grammar format cannot be accepted (llguidance's own words), or None when it can."""
    if syntax not in SYNTAXES:
        return f"the grammar syntax must be 'lark' or 'regex', not {syntax!r}"
    if not isinstance(definition, str) or not definition.strip():
        return "the grammar `definition` must be a non-empty string"
    if len(definition) > MAX_DEFINITION_CHARS:
        return f"the grammar `definition` is longer than {MAX_DEFINITION_CHARS} characters"
    nested = Freeform(str(syntax), definition)
    # Checked as it will be used: nested in a grammar of the whole completion.
    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(
        f'start: "x" body\nbody: {nested.lark_rule()}\n'))
    return f"the {syntax} grammar does not compile: {error.strip()}" if error else None


def declaration(name: str, description: str, freeform: Freeform) -> str:
    """The tool in the namespace's declarations: its description, that it takes raw text, and its grammar."""
    lines = rust_lines(description) if description else []
    lines.append("This tool takes raw text, not JSON: write its input as the message, as is.")
    if freeform.syntax == "lark":
        lines += ["Its input follows this Lark grammar:", *rust_lines(freeform.definition)]
    elif freeform.syntax == "regex":
        lines += ["Its input matches this regular expression:", *rust_lines(freeform.definition)]
    comments = "".join(f"// {line}\n" for line in lines)
    return f"{comments}type {name} = (_: string) => any;\n"


def _lark_regex(pattern: str) -> str:
    """A regex as the body of a Lark `/.../` literal: unescaped slashes escaped, line breaks written as escapes."""
    out, escaped = [], False
    for character in pattern:
        if escaped:
            out.append(character)
            escaped = False
        elif character == "\\":
            out.append(character)
            escaped = True
        elif character == "/":
            out.append("\\/")
        elif character == "\n":
            out.append("\\n")
        elif character == "\r":
            out.append("\\r")
        else:
            out.append(character)
    return "".join(out)
