"""`configuration_update` input items: reasoning effort, verbosity and output format from that point of the
conversation on, each until a later update replaces it (OpenAI's Responses API; Codex changes effort mid-session so).

Harmony carries reasoning effort in one place, the system message at the top of the prompt (`Reasoning: high`),
and verbosity as a line of the developer message: there is no form for a level that changes mid-conversation. The
setting in effect is the latest update's (over the request's own `reasoning` and `text`), rendered where Harmony
puts it; the earlier turns it did not apply to keep their answers, and their reasoning is not shown again anyway
(gpt-oss sees the current turn's reasoning only). The cost: the system message is the first thing in the prompt,
so a turn that changes the effort renders a prompt whose prefix differs from the cached one at its start, and the
engine prefills it once in full; later turns at the same effort share the new prefix again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Settings:
    """The settings the configuration_update items set, as the API names them; None: not set by any."""

    effort: str | None = None
    verbosity: str | None = None
    text_format: dict[str, Any] | None = None


def configured_settings(items: list[dict[str, Any]]) -> Settings:
    """The settings of the last `configuration_update` among `items` (history and input) that sets each one."""
    settings = Settings()
    for item in items:
        if item["type"] != "configuration_update":
            continue
        text = item.get("text") or {}
        settings.effort = (item.get("reasoning") or {}).get("effort") or settings.effort
        settings.verbosity = text.get("verbosity") or settings.verbosity
        settings.text_format = text.get("format") or settings.text_format
    return settings
