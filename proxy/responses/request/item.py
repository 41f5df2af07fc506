"""One output item of a response as the fold builds it (`Item`), shared by the fold (`proxy/responses/output/fold.py`)
and the server tools' items (`proxy/responses/output/server_output.py`)."""

from __future__ import annotations

from typing import Any

from parsers.events import ItemKind
from proxy.responses.hosted import CallTarget

Payload = dict[str, Any]
TextDelta = tuple["Item", str]  # text added to an item; written as that item's delta events


class Item:
    __slots__ = ("body", "delta_prefixes", "index", "kind", "pieces", "target")

    def __init__(self, index: int, body: dict[str, Any], kind: ItemKind, target: CallTarget | None = None) -> None:
        self.index, self.body, self.kind, self.pieces = index, body, kind, []
        self.delta_prefixes: tuple[bytes, ...] = ()  # each delta event's frame up to the delta text
        self.target = target  # what a server call calls (proxy/responses/output/server_output.py)

    @property
    def text(self) -> str:
        return "".join(self.pieces)
