"""The sealed blobs of one request (proxy/responses/sealing.py), opened once each, within the context window.

A blob of a few hundred characters may hold tens of thousands of reasoning tokens, and a client may send the same
blob thousands of times: expanded copy by copy, 850 kB of JSON became 48 million token ids (2.4 GB) before any
length check. So every blob a request uses is charged against one budget, the context window, as it is used: a
reasoning blob its tokens (each copy again, since each renders), a text payload one unit per
`BYTES_PER_UNIT` bytes. A blob opens at most once per request, and decompresses no further than the budget left;
past the budget the request is a 400 `context_length_exceeded`, as the same prompt in plain text would be.

Opening blobs is work (decrypting, decompressing): a request carrying many blob characters, wherever they are
(reasoning and compaction items, `agent_message` parts, sealed call arguments), is translated in a worker thread
(`off_loop_when_large`). A blob that does not open is logged once per request, with how many more did not: a
client sending thousands of forged blobs writes one line, not thousands.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from proxy.errors import APIError, invalid_request
from proxy.responses.sealing import AGENT_MESSAGE, COMPACTION, SealedReasoning, Sealer, TooLarge

logger = logging.getLogger("harmony_proxy")

# A token id in a payload takes at most 7 bytes ("201087,"); a budget of n units decompresses at most this many
# bytes a unit, so a blob that fits is never cut, and one that does not stops early.
BYTES_PER_UNIT = 8
_SLACK_BYTES = 64  # the payload's own JSON: braces, key
# Blobs (characters, all items) past which they are opened in a worker thread, off the event loop.
OFF_LOOP_CHARS = 32_768


class Unsealer:
    def __init__(self, sealer: Sealer, budget: int) -> None:
        """`budget`: the tokens this request's blobs may expand to, all together (the context window)."""
        self._sealer = sealer
        self.budget = budget
        self.left = budget
        self._opened: dict[tuple[str, str], Any] = {}
        self.refused = 0  # blobs of this request that did not open

    def reasoning(self, blob: str, where: str) -> SealedReasoning | None:
        """What a reasoning blob holds, charged to the budget; None when it does not open (logged)."""
        key = ("reasoning", blob)
        if key not in self._opened:
            self._opened[key] = self._open(
                lambda limit: self._sealer.open_reasoning(blob, limit, self._refused), where)
        sealed: SealedReasoning | None = self._opened[key]
        if sealed is not None:
            self._charge(len(sealed.tokens) if sealed.tokens is not None else _units(sealed.text), where)
        return sealed

    def summary(self, blob: str, where: str) -> str | None:
        """The summary a compaction blob holds, charged to the budget; None when it does not open (logged)."""
        key = (COMPACTION, blob)
        if key not in self._opened:
            payload = self._open(lambda limit: self._sealer.open(COMPACTION, blob, limit, self._refused), where)
            summary = payload.get("summary") if payload is not None else None
            self._opened[key] = summary if isinstance(summary, str) else None
        text: str | None = self._opened[key]
        if text is not None:
            self._charge(_units(text), where)
        return text

    @property
    def prefix(self) -> str:
        """What every blob sealed here starts with (Codex sends sealed call arguments back without saying which)."""
        return self._sealer.prefix

    def agent_message(self, blob: str, where: str) -> dict[str, Any] | None:
        """What a sealed agent-message value holds (Codex's sub-agents), charged to the budget; None when it does
        not open (logged)."""
        key = (AGENT_MESSAGE, blob)
        if key not in self._opened:
            self._opened[key] = self._open(
                lambda limit: self._sealer.open(AGENT_MESSAGE, blob, limit, self._refused), where)
        payload: dict[str, Any] | None = self._opened[key]
        if payload is not None:
            self._charge(sum(_units(value) for value in payload.values() if isinstance(value, str)), where)
        return payload

    def _open(self, open_blob: Any, where: str) -> Any:
        try:
            return open_blob(self.left * BYTES_PER_UNIT + _SLACK_BYTES)
        except TooLarge:
            raise self._exceeded(where) from None

    def _refused(self, kind: str, why: str) -> None:
        """The first blob of the request that does not open is logged; the others are counted (`refused`)."""
        self.refused += 1
        if self.refused == 1:
            logger.warning("ignored the encrypted_content of a %s item: %s; rendering the item's text, if it has "
                           "any (other blobs of this request that do not open are not logged)", kind, why)

    def _charge(self, units: int, where: str) -> None:
        self.left -= max(units, 1)
        if self.left < 0:
            raise self._exceeded(where)

    def _exceeded(self, where: str) -> APIError:
        return invalid_request(
            f"This model's maximum context length is {self.budget} tokens. However, the encrypted_content of your "
            f"input expands to more than that (each copy of a blob counts). Please reduce the length of the input.",
            param=where, code="context_length_exceeded")


async def off_loop_when_large(items: list[dict[str, Any]], work: Any) -> Any:
    """`work()`, in a worker thread when `items` carry many blob characters (decrypting and decompressing them
    holds the event loop), else here."""
    return await asyncio.to_thread(work) if blob_characters(items) > OFF_LOOP_CHARS else work()


def blob_characters(items: list[dict[str, Any]]) -> int:
    """The characters of what may be blobs: items' `encrypted_content`, their content parts' (`agent_message`),
    and function call arguments (which may hold sealed values: proxy/responses/agent_messages.py)."""
    total = 0
    for item in items:
        blob, content, arguments = item.get("encrypted_content"), item.get("content"), item.get("arguments")
        total += len(blob) if isinstance(blob, str) else 0
        total += len(arguments) if isinstance(arguments, str) else 0
        if isinstance(content, list):
            total += sum(len(part["encrypted_content"]) for part in content
                         if isinstance(part, dict) and isinstance(part.get("encrypted_content"), str))
    return total


def _units(text: str) -> int:
    return len(text) // BYTES_PER_UNIT + 1
