"""Stored responses and conversations: the small interface the routes need, and what its backends share.

A backend keeps responses with their input and output items (found by id, and as chains through
`previous_response_id`), background jobs, and conversations with their items. Two implement it, one module each:
`store_sqlite.py` (embedded, the default) and `store_postgres.py` (`--store-url postgresql://...`, shared by
replicas on several machines). Each save is one transaction, so a crash leaves either the old record or the new
one, never half of one, and nothing is acknowledged before it is committed.

Each store instance is an owner (a per-process token): an unfinished (queued or in-progress) response it saves
is recorded in `jobs` as its own, with a heartbeat that it renews while it runs the response, and a flag other
processes set to ask for a cancel.
`proxy/responses/transport/jobs.py` says how the owner and the other processes use them.
Each backend creates its schema and migrates an older one through its numbered list of `MIGRATIONS`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

UNFINISHED = ("queued", "in_progress")
OnOperation = Callable[[str, float, bool], None]  # (operation, seconds, ok): the metrics


@dataclass
class StoredResponse:
    resource: dict[str, Any]  # the response object, as GET /v1/responses/{id} returns it
    input_items: list[dict[str, Any]]  # the request's own input items, with ids
    # A background response's streaming events not saved yet, as (sequence_number, SSE frame): the save appends
    # them to its stored events (a repeated one is ignored), which `GET /v1/responses/{id}?stream=true` replays.
    events: list[tuple[int, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.resource["id"]


class ResponseStore(Protocol):
    async def open(self) -> None:
        """Connect, and create or migrate the schema, before the first operation."""
        ...

    async def save(self, record: StoredResponse) -> None:
        """Save a response; an unfinished one becomes this store's job (see `save_owned`), a finished one no job."""
        ...

    async def save_owned(self, record: StoredResponse) -> bool:
        """Save a response only while it is still this store's job; False (nothing saved) once it is not:
        deleted, or ended by another process as abandoned."""
        ...

    async def load(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool:
        """Delete a response, its items and its stored events."""
        ...

    async def events(self, response_id: str, after: int) -> tuple[str | None, list[str]]:
        """A response's status (None if not stored), then its stored events (SSE frames) numbered after
        `after`, in order. Read in that order, so that events read after a finished status are all there are."""
        ...

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """Input and output items of the chain of responses ending at `response_id`, oldest first."""
        ...

    async def items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Stored items (input or output) by id; ids not found are left out."""
        ...

    async def request_cancel(self, response_id: str) -> bool:
        """Ask the owner of an unfinished response to cancel it; False if no process runs it."""
        ...

    async def cancel_requests(self) -> list[str]:
        """Ids of this store's jobs that another process asked to cancel."""
        ...

    async def renew(self) -> None:
        """Refresh the heartbeat of this store's jobs: their process is alive."""
        ...

    async def heartbeats(self) -> dict[str, float | None]:
        """Each unfinished response's owner's last heartbeat (None: it has no owner). Other processes watch these
        to tell a dead owner (`proxy/responses/transport/jobs.py`)."""
        ...

    async def end_abandoned(self, stale: dict[str, float | None],
                            end: Callable[[StoredResponse, bool], None]) -> list[str]:
        """End the unfinished responses of `stale` whose heartbeat is still the one given there (the owner did not
        renew since it was seen): `end(record, cancel_requested)` gives each a final status, and it is saved, in
        one transaction with that look. Returns their ids."""
        ...

    async def close(self) -> None:
        """Close; jobs still owned are given up, so other processes end them at once."""
        ...

    async def check(self) -> None:
        """Return when the store answers; raise saying why not (readiness, `GET /ready`)."""
        ...

    # Conversations: a conversation object and its items, in the order they were added. A response saved with
    # `conversation` in its resource adds its input and output items to that conversation when it ends, in the
    # same transaction as its final save.

    async def create_conversation(self, conversation: dict[str, Any], items: list[dict[str, Any]]) -> None:
        """Save a new conversation with its first items (with ids, none repeated)."""
        ...

    async def load_conversation(self, conversation_id: str) -> dict[str, Any] | None: ...

    async def update_conversation(self, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        """Replace the metadata; the conversation, None if there is none."""
        ...

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete the conversation and its items (the responses that added them keep their own copies)."""
        ...

    async def add_conversation_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Append items; False if there is no such conversation. Raises DuplicateItem (nothing added) when an
        item's id is already in the conversation."""
        ...

    async def conversation_items(self, conversation_id: str, after: str | None = None, limit: int | None = None,
                                 newest_first: bool = False) -> list[dict[str, Any]] | None:
        """Items in order (oldest first unless `newest_first`), those after the item `after` only, at most
        `limit`; None if there is no such conversation. An `after` not in it gives no items."""
        ...

    async def conversation_item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None: ...

    async def delete_conversation_item(self, conversation_id: str, item_id: str) -> bool: ...


class StoreUnavailable(Exception):
    """The database cannot be reached now (it restarts, the network is down): a 503, and the client retries."""


class Unstorable(Exception):
    """A value the database cannot hold (PostgreSQL's text holds no NUL; an index entry has a size limit): a 400.
    Ids are checked where they enter (`proxy/ids.py`), so this is the store's own refusal of what slipped past."""


class DuplicateItem(Exception):
    def __init__(self, item_id: str) -> None:
        super().__init__(item_id)
        self.item_id = item_id




def new_owner() -> str:
    """This store instance's owner token: unique even if a pid is reused, or on another machine."""
    return f"{os.getpid()}-{secrets.token_hex(6)}"


def loads(text: str) -> Any:
    """A stored JSON text. One saved before text that UTF-8 cannot carry was refused (proxy/validation.py) may hold
    a lone surrogate, which no answer could encode: it reads as U+FFFD, so that nothing stored can fail a GET."""
    value = json.loads(text)
    if "\\ud" in text or "\\uD" in text:  # json.dumps escapes every surrogate, paired or not
        shown = json.dumps(value, ensure_ascii=False)
        try:
            shown.encode("utf-8")
        except UnicodeEncodeError:
            value = json.loads(shown.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
    return value


def chain_items(rows: list[tuple[str, str]]) -> list[dict[str, Any]] | None:
    """A response chain's items, oldest response first, from its rows of (input items, resource) as stored; None
    for no rows (no such response)."""
    if not rows:
        return None
    items: list[dict[str, Any]] = []
    for input_items, resource in rows:
        items += loads(input_items) + loads(resource)["output"]
    return items


def conversation_object(conversation_id: str, created_at: int, metadata: dict[str, str]) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": metadata}
