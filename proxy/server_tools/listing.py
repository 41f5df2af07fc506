"""What an MCP server offers, as plain frozen values: safe to cache and share between responses."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mcp_types import Tool


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any] = field(hash=False, compare=False)
    annotations: dict[str, Any] | None = field(default=None, hash=False, compare=False)  # MCP's hints, camelCase

    @classmethod
    def from_mcp(cls, tool: Tool) -> McpTool:
        annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
        return cls(tool.name, tool.description or "", dict(tool.input_schema), annotations or None)

    def as_openai(self) -> dict[str, Any]:
        """The tool as a Responses `mcp_list_tools` item lists it."""
        return {"name": self.name, "description": self.description or None, "input_schema": self.input_schema,
                "annotations": self.annotations}


@dataclass(frozen=True)
class ServerTools:
    """A server's name and instructions as it gave them (either may be absent) and its tools."""

    server_name: str | None
    instructions: str | None
    tools: tuple[McpTool, ...]

    def only(self, allowed: Iterable[str] | None) -> ServerTools:
        """The tools whose names are in `allowed` (None: all of them), in the server's order."""
        if allowed is None:
            return self
        names = frozenset(allowed)
        return ServerTools(self.server_name, self.instructions, tuple(t for t in self.tools if t.name in names))

    def get(self, name: str) -> McpTool | None:
        return next((tool for tool in self.tools if tool.name == name), None)
