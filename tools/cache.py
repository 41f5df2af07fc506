"""Work done once per distinct content: the catalog of checked function tools, and their
TypeScript declarations.

Agent frameworks resend the same tools every turn. The catalog checks a declaration (its name, and its schema
against the JSON Schema meta-schema) the first time it sees it and keeps the checked `FunctionTool`, keyed by the
declaration's canonical JSON; `ToolDeclarations` keeps each tool's declaration text by the same key, and the
renderer keys the tokens of a whole tools section by the tuple of those keys. The maps are bounded, so a client
sending endless new tools only evicts older entries; the per-request bounds (number of tools, total size of their
JSON) cap the work one request can ask for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tools import freeform, typescript
from tools.bounded_cache import BoundedCache, CacheStats
from tools.definitions import FunctionTool, ToolError, declaration_key, make_tool

MAX_TOOLS = 128  # OpenAI refuses more
MAX_TOOLS_SCHEMA_BYTES = 1024 * 1024


# name, description, parameters, strict: as the request sent them; then optionally the namespace (checked) and a
# custom tool's Freeform format
Declaration = tuple[Any, ...]


class ToolCatalog:
    """Checked function tools by content, and the bounds on the tools of one request.

    The cache is bounded by entries and by bytes of declaration JSON: a cached tool holds its schema as parsed
    JSON (several times the bytes of its text), and every such object adds to the garbage collector's work.
    """

    def __init__(
        self,
        max_tools: int = MAX_TOOLS,
        max_schema_bytes: int = MAX_TOOLS_SCHEMA_BYTES,
        max_entries: int = 1024,
        max_cached_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.max_tools = max_tools
        self.max_schema_bytes = max_schema_bytes
        self._checked: BoundedCache[str, FunctionTool] = BoundedCache(max_entries, max_cached_bytes)

    def check_count(self, tools: Any) -> None:
        """Refuse too many tools before any other work on them."""
        if isinstance(tools, list) and len(tools) > self.max_tools:
            raise ToolError(
                f"Invalid 'tools': array too long. Expected an array with maximum length {self.max_tools}, but got "
                f"an array with length {len(tools)} instead.", "tools", "array_above_max_length")

    def read(self, declarations: Sequence[Declaration], where: Callable[[int], str]) -> list[FunctionTool]:
        """The checked tools; `where(i)` is the path of declaration i in the request, for error messages."""
        self.check_count(declarations)
        keys = [declaration_key(*declaration) for declaration in declarations]
        size = sum(len(key) if key.isascii() else len(key.encode()) for key in keys)
        if size > self.max_schema_bytes:
            raise ToolError(
                f"Invalid 'tools': the function declarations add up to {size} bytes of JSON; the maximum is "
                f"{self.max_schema_bytes}.", "tools", "invalid_value")
        tools = []
        for position, (declaration, key) in enumerate(zip(declarations, keys)):
            tool = self._checked.get(key)
            if tool is None:
                # only successes are kept: errors name a position
                tool = make_tool(*declaration[:4], where(position), *declaration[4:])
                self._checked.put(key, tool, len(key))
            tools.append(tool)
        return tools

    def stats(self) -> CacheStats:
        return self._checked.stats()


class ToolDeclarations:
    """Each tool's declaration text (tools/typescript.py), by the tool's key, so that a tools section made of
    known tools in a new combination only joins texts and encodes them (its tokens cannot be joined per tool:
    a token can span the end of one declaration and the `//` opening the next)."""

    def __init__(self, max_entries: int = 1024, max_chars: int = 4 * 1024 * 1024) -> None:
        self._texts: BoundedCache[str, str] = BoundedCache(max_entries, max_chars)

    def section(self, tools: Sequence[FunctionTool]) -> str:
        return typescript.tools_section([self.declaration(tool) for tool in tools])

    def declaration(self, tool: FunctionTool) -> str:
        text = self._texts.get(tool.key)
        if text is None:
            if tool.freeform is not None:
                text = freeform.declaration(tool.name, tool.description, tool.freeform)
            else:
                text = typescript.declaration(tool.name, tool.description, tool.parameters)
            self._texts.put(tool.key, text, len(text))
        return text

    def stats(self) -> CacheStats:
        return self._texts.stats()
