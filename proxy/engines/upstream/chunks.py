"""The upstream's `/v1/completions` stream read: SSE lines to `data:` payloads, payloads to typed chunks.

Decoding is msgspec's (a dependency already): every payload of one step (what `UpstreamConnection.next_lines`
hands on) is decoded in one call, into structs that keep only the fields we read. Fields we do not read are skipped
without building Python objects, so vLLM's echo of the prompt's ids (`prompt_token_ids`, ~0.6 MB for a 100k-token
prompt) costs a scan, not a list of 100k ints; the stdlib's json built every object and took about a tenth of the
front end's CPU per token.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec


# gc=False: chunks hold only JSON values (no cycles), and thousands of them are decoded in a turn of the event loop (a
# step of a few for each stream): tracked, they would trigger the collector's young generation several times a turn.
class Logprobs(msgspec.Struct, gc=False):
    tokens: list[str] | None = None  # with vLLM's return_tokens_as_token_ids: `token_id:N`


class Choice(msgspec.Struct, gc=False):
    token_ids: list[int] | None = None
    logprobs: Logprobs | None = None
    text: str | None = None
    finish_reason: str | None = None
    # vLLM and trtllm-serve: the stop token id (None for the end token); SGLang: `matched_stop`.
    stop_reason: int | str | None | msgspec.UnsetType = msgspec.UNSET
    matched_stop: int | str | None = None

    @property
    def stop(self) -> int | str | None:
        return self.matched_stop if self.stop_reason is msgspec.UNSET else self.stop_reason


class Nvext(msgspec.Struct, gc=False):
    completion_token_ids: list[int] | None = None  # NVIDIA Dynamo's ids, asked for through nvext.extra_fields


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] | None = None
    usage: dict[str, Any] | None = None
    nvext: Nvext | None = None
    error: Any = msgspec.UNSET


class ChunkError(Exception):
    """A payload that is not a completion chunk; the message says what was wrong."""


class UpstreamFailed(Exception):
    """The upstream said it failed (Dynamo's `error` event); the message is its own."""


_DECODE = msgspec.json.Decoder(list[Chunk])
# A `data:` line's payload, if it has one (JSON takes trailing blanks). Greedy: a lazy `.*?$` tried the end of the
# line at every byte, 7x slower, the front end's largest cost per token behind 4,096 paced streams.
_DATA = re.compile(rb"^data:[ \t]*(\S[^\n]*)", re.MULTILINE)


class EventReader:
    """SSE lines in, `data:` payloads out. Lines come whole (see `UpstreamConnection.next_lines`); an `event:`
    line holds until the blank line that ends its event."""

    def __init__(self) -> None:
        self._event = b""
        self.done = False  # `data: [DONE]` came: later payloads are ignored

    def payloads(self, lines: bytes) -> list[bytes]:
        if not self._event and not self.done and b"event:" not in lines and b"\r" not in lines:
            found = _DATA.findall(lines)  # what nearly every step holds: `data:` lines and blank ones, one C call
            if b"[DONE]" in lines:  # the end (with the last events, in the same step)
                for index, payload in enumerate(found):
                    if payload.rstrip() == b"[DONE]":
                        self.done = True
                        del found[index:]
                        break
            return found
        if b"\r" in lines:
            lines = lines.replace(b"\r\n", b"\n")
        found = []
        for line in lines.split(b"\n")[:-1]:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                elif payload and not self.done:
                    found.append(payload)
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
            elif not line:
                self._event = b""
            elif line.startswith(b":") and self._event == b"error":  # Dynamo: errors as an `error` event, a comment
                raise UpstreamFailed(line[1:].strip().decode("utf-8", "replace"))
        return found


def decode(payloads: list[bytes]) -> list[Chunk]:
    """The chunks of payloads that arrived together, in one decoding."""
    try:
        return _DECODE.decode(b"[" + b",".join(payloads) + b"]")
    except msgspec.ValidationError as exc:
        raise ChunkError(f"sent a chunk that does not read as a completion ({exc})") from None
    except msgspec.DecodeError:
        raise ChunkError("sent a chunk that is not JSON") from None


def error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
