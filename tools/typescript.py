"""Function tools as gpt-oss reads them: the TypeScript-like declarations of the developer message.

A port of openai-harmony's `template_tools_section` (src/encoding.rs, v0.0.8): a tool is its description as `//`
lines and `type NAME = (_: ARGS) => any;`, tools are held in a namespace, `functions` or one of its own. The
parameters' JSON Schema becomes its type in tools/typescript_types.py, exactly as the library writes it wherever
the library loses no information.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tools.rust_text import rust_lines
from tools.typescript_types import schema_to_typescript


def tools_section(declarations: Sequence[str]) -> str:
    """`# Tools` with the `functions` namespace holding these declarations (each from `declaration`)."""
    return ("# Tools\n\n## functions\n\nnamespace functions {\n\n" + "\n".join(declarations)
            + "\n} // namespace functions")


def namespace_section(name: str, description: str | None, declarations: Sequence[str]) -> str:
    """`## {name}`, the description as `//` lines, then the namespace holding the declarations (each from
    `declaration`), as openai-harmony writes a `ToolNamespaceConfig` (src/encoding.rs, `template_tools_section`)."""
    lines = rust_lines(description) if description else []
    if not declarations:  # the library writes a namespace without tools as its description alone
        return "\n".join([f"## {name}\n", *lines])
    head = "".join(f"// {line}\n" for line in lines)
    return f"## {name}\n\n{head}namespace {name} {{\n\n" + "\n".join(declarations) + f"\n}} // namespace {name}"


def declaration(name: str, description: str, parameters: Any) -> str:
    """One function: its description as `//` lines, then `type NAME = (_: ARGS) => any;` and a line break."""
    comments = "".join(f"// {line}\n" for line in rust_lines(description))
    if parameters is None:
        return f"{comments}type {name} = () => any;\n"
    return f"{comments}type {name} = (_: {schema_to_typescript(parameters)}) => any;\n"
