"""Responses streaming events → SSE frames (`event: T` + `data: {...}`) or WebSocket text messages (the JSON
alone), numbered from 0 in order."""

from __future__ import annotations

import json
from collections.abc import Iterable
from json.encoder import encode_basestring  # type: ignore[attr-defined]

from proxy.responses.output.fold import Payload, TextDelta


class EventWriter:
    def __init__(self) -> None:
        self._sequence = 0

    def frames(self, payloads: Iterable[Payload | TextDelta]) -> bytes:
        return b"".join(self.numbered_frames(payloads))

    def numbered_frames(self, payloads: Iterable[Payload | TextDelta]) -> list[bytes]:
        """One SSE frame per event; the first is numbered `sequence` as it was before the call, each next one
        the number after."""
        frames: list[bytes] = []
        for payload in payloads:
            if type(payload) is tuple:
                item, text = payload
                delta = encode_basestring(text).encode()
                for prefix in item.delta_prefixes:  # the item's delta event(s), rendered when it started
                    frames.append(b"%s%s,\"sequence_number\":%d}\n\n" % (prefix, delta, self._sequence))
                    self._sequence += 1
            else:
                payload["sequence_number"] = self._sequence  # type: ignore[index]
                self._sequence += 1
                data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
                kind = payload["type"].encode()  # type: ignore[index]
                frames.append(b"event: %s\ndata: %s\n\n" % (kind, data.encode()))
        return frames

    @property
    def sequence(self) -> int:
        """The number of the next event."""
        return self._sequence

    def messages(self, payloads: Iterable[Payload | TextDelta], stream_id: str | None = None) -> list[str]:
        """The same events as WebSocket text messages, one per event; each names the create's `stream_id`
        (its lane) when it named one."""
        lane = "" if stream_id is None else ',"stream_id":' + json.dumps(stream_id)
        messages: list[str] = []
        for payload in payloads:
            if type(payload) is tuple:
                item, text = payload
                delta = encode_basestring(text)
                for prefix in item.delta_prefixes:  # the SSE frame's start: its JSON follows `data: `
                    head = prefix[prefix.index(b"data: ") + 6:].decode()
                    messages.append(f'{head}{delta},"sequence_number":{self._sequence}{lane}}}')
                    self._sequence += 1
            else:
                payload["sequence_number"] = self._sequence  # type: ignore[index]
                if stream_id is not None:
                    payload["stream_id"] = stream_id  # type: ignore[index]
                self._sequence += 1
                messages.append(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
        return messages
