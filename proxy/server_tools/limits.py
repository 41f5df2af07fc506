"""Limits on what MCP servers may cost a response: time and the size of what they send back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class McpLimits:
    connect_timeout: float = 15.0  # seconds to connect and agree on a protocol version
    list_timeout: float = 30.0  # seconds to list a server's tools (every page)
    call_timeout: float = 60.0  # seconds one tool call may take; then it is cancelled and reported as failed
    # Characters of a tool's output the model is shown: about 8k tokens. Past it the output is cut and says so.
    max_output_chars: int = 32_768
    max_event_bytes: int = 4 * 1024 * 1024  # one server-sent event (the SDK's own default is 1 MiB)
    max_pages: int = 20  # tools/list pages followed before the listing is taken as it is
