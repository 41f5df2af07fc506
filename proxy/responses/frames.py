"""Responses streaming events → SSE frames (`event: T` + `data: {...}`), numbered from 0 in order."""

from __future__ import annotations

import json
from collections.abc import Iterable
from json.encoder import encode_basestring  # type: ignore[attr-defined]

from proxy.responses.output import Payload, TextDelta


class EventWriter:
    def __init__(self) -> None:
        self._sequence = 0

    def frames(self, payloads: Iterable[Payload | TextDelta]) -> bytes:
        parts: list[bytes] = []
        for payload in payloads:
            if type(payload) is tuple:
                item, text = payload
                delta = encode_basestring(text).encode()
                for prefix in item.delta_prefixes:  # the item's delta event(s), rendered when it started
                    parts += (prefix, delta, b',"sequence_number":%d}\n\n' % self._sequence)
                    self._sequence += 1
            else:
                payload["sequence_number"] = self._sequence  # type: ignore[index]
                self._sequence += 1
                data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
                parts.append(b"event: %s\ndata: %s\n\n" % (payload["type"].encode(), data.encode()))  # type: ignore[index]
        return b"".join(parts)
