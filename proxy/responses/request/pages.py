"""OpenAI's cursor pages of items (`order`, `limit`, `after`), shared by input items and conversation items."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.datastructures import QueryParams

from proxy.errors import invalid_request
from proxy.ids import checked_id


@dataclass(frozen=True)
class PageQuery:
    newest_first: bool
    limit: int
    after: str | None


def page_query(query: QueryParams) -> PageQuery:
    """The page asked for: `order` asc|desc (default desc), `limit` 1-100 (default 20), `after` an item id."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("`order` must be 'asc' or 'desc'.", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise invalid_request("`limit` must be an integer from 1 to 100.", param="limit")
    after = query.get("after")
    return PageQuery(order == "desc", limit, None if after is None else checked_id(after, "after"))


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
