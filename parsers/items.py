"""Folding item events back into whole items: what a turn said, once it is over."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from parsers.events import Event, ItemDone, ItemKind, ItemStarted


@dataclass
class OutputItem:
    kind: ItemKind
    name: str | None = None  # function name, for tool calls
    pieces: list[str] = field(default_factory=list, repr=False)
    complete: bool = False
    token_count: int = 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ItemCollector:
    """Accumulates events into items; text is joined only when read, so collecting stays linear."""

    def __init__(self) -> None:
        self.items: list[OutputItem] = []

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            if type(event) is str:
                self.items[-1].pieces.append(event)
            elif isinstance(event, ItemStarted):
                self.items.append(OutputItem(event.kind, event.name))
            elif isinstance(event, ItemDone):
                item = self.items[event.index]
                item.complete, item.token_count = event.complete, event.token_count

    def summary(self) -> list[tuple[str, str | None, str, bool]]:
        """(kind, name, text, complete) per item: a plain value to compare in tests and fixtures."""
        return [(item.kind.value, item.name, item.text, item.complete) for item in self.items]
