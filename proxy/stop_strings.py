"""Stop strings, matched against the visible answer text as it streams.

OpenAI keeps the text before the stop string and drops the rest; as in a generator, the stop string that is
complete first ends the text. We match only answer text (`content`), not
reasoning or tool arguments: a stop string the model happens to think about must not cut its answer short.
Text that might be the start of a stop string is held back until the next delta decides, so a stream never
shows what the non-streamed answer would not. Work per delta is bounded by the stop strings' length.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    @property
    def hit(self) -> bool:
        return self.matched is not None

    def feed(self, text: str) -> str:
        """The text that is safe to show now; sets `hit` when a stop string completes."""
        if not self._stops or self.hit:
            return "" if self.hit else text
        window = self._held + text  # what is held is shorter than the longest stop string
        # Generation halts as soon as any stop string is complete: the one that ends first wins (then the longest).
        found = [(position + len(stop), position, stop) for stop in self._stops if (position := window.find(stop)) >= 0]
        if found:
            _end, cut, self.matched = min(found)
            self._held = ""
            return window[:cut]
        keep = self._partial_suffix(window)
        self._held = window[len(window) - keep :] if keep else ""
        return window[: len(window) - keep]

    def flush(self) -> str:
        """The end of the text: what was held back was not a stop string after all."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, window: str) -> int:
        """Length of the longest suffix of window that is a proper prefix of some stop string."""
        for size in range(min(self._longest - 1, len(window)), 0, -1):
            tail = window[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
