"""A tool call's outcome as the model and the client see it: text, whether it failed, whether it was cut."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)


@dataclass(frozen=True)
class ToolOutput:
    """`text` is what the model is shown: the tool's output, or why the call failed when `failed`."""

    text: str
    failed: bool = False
    truncated: bool = False  # the output was longer than the limit and `text` ends with a marker saying so

    @property
    def error(self) -> str | None:
        return self.text if self.failed else None


def truncated_marker(total: int, shown: int) -> str:
    return f"\n[output truncated: the tool returned {total} characters; the first {shown} are shown]"


def capped(text: str, max_chars: int, failed: bool = False) -> ToolOutput:
    """`text` cut to `max_chars` characters, with a marker saying how much there was."""
    if len(text) <= max_chars:
        return ToolOutput(text, failed)
    return ToolOutput(text[:max_chars] + truncated_marker(len(text), max_chars), failed, truncated=True)


def from_result(result: CallToolResult, max_chars: int, scrub: Callable[[str], str] = str) -> ToolOutput:
    """The text of a `tools/call` result: its text blocks joined by line breaks; other blocks named, not
    inlined (an image is no text for gpt-oss); the structured result as JSON when there is no text at all.
    `scrub` cleans the text before it is cut (of the client's header values, which a server may echo)."""
    parts = [_block_text(block) for block in result.content]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if result.is_error and not text:
        text = "The tool reported an error without a message."
    return capped(scrub(text), max_chars, failed=result.is_error)


def _block_text(block: ContentBlock) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, (ImageContent, AudioContent)):
        return f"[{block.type} content ({block.mime_type}) not shown]"
    if isinstance(block, ResourceLink):
        return f"[resource: {block.uri}]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, BlobResourceContents):
            return f"[binary resource {resource.uri} not shown]"
        return resource.text
    return ""
