"""Compaction items in a conversation: what a `compaction` item stands for, and what it replaces.

A compaction item holds, sealed (proxy/responses/sealing.py), gpt-oss's own summary of the conversation before it
(proxy/responses/compaction.py writes it). In a later input it replaces that conversation: of the items before
the latest compaction item only the messages from the user and the instructions (system, developer) stay, as
OpenAI's compacted window keeps them; the summary follows them as a message to the model; then come the items
after it. So a stateless client may send its whole history, or drop what precedes the compaction item (as
OpenAI suggests): the prompt is the same.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import invalid_request
from proxy.ids import new_id
from proxy.responses.sealing import COMPACTION, Sealer

# How the summary is put to the model: a user message, as the model's own summary of where the work stands.
SUMMARY_HEADING = ("The conversation so far was compacted to save context. This is your own summary of it: the "
                   "task, the decisions made, the files touched, the open threads and the tool results still "
                   "needed. Continue the work from here.\n\n")
_KEPT_ROLES = ("user", "system", "developer")


def compaction_item(sealer: Sealer, summary: str) -> dict[str, Any]:
    return {"id": new_id("cmp_"), "type": "compaction",
            "encrypted_content": sealer.seal(COMPACTION, {"summary": summary})}


def latest_compaction(items: list[dict[str, Any]]) -> int:
    """The position of the latest compaction item, or -1."""
    return max((position for position, item in enumerate(items) if item["type"] == "compaction"), default=-1)


def kept_before_compaction(item: dict[str, Any]) -> bool:
    """Whether an item before the latest compaction item is still rendered: messages from the user, instructions."""
    return item["type"] == "message" and item["role"] in _KEPT_ROLES


def split_trigger(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """(items without a terminal `compaction_trigger`, whether there was one); one elsewhere is a 400."""
    triggers = [position for position, item in enumerate(items) if item["type"] == "compaction_trigger"]
    if not triggers:
        return items, False
    if triggers != [len(items) - 1]:
        raise invalid_request("A compaction_trigger item must be the last input item.",
                              param=f"input[{triggers[0]}]", code="invalid_value")
    return items[:-1], True


def retained_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user messages a compacted window keeps (OpenAI's `/responses/compact` returns them)."""
    return [item for item in items if item["type"] == "message" and item["role"] == "user"]
