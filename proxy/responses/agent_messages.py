"""Codex's sub-agents (Multi-Agent V2): encrypted tool parameters sealed on the way out, `agent_message` items
opened on the way in.

Codex declares the `message` parameter of its `collaboration` tools (spawn_agent, send_message, followup_task)
with `"encrypted": true`. A call to such a tool leaves here with that value sealed under the server's key
(sealing.py, kind `agent_message`) and the parameter named in the item's `encrypted_function_args`; Codex hands
the blob on unread, as the `encrypted_content` part of an `agent_message` item in the sub-agent's next request
(`author` "/root", `recipient` "/root/NAME", an `input_text` header before it). A blob also holds the call's
arguments as the model wrote them, so the parent's history renders the call token for token (Codex sends the
call back without `encrypted_function_args`).

An `agent_message` renders as a user message: its header says who sent it (Codex writes "Message Type: ...,
Sender: ..., Payload:"), and gpt-oss acts on user messages, where a tool result the model never asked for is
not something it was trained to read. A sub-agent's answer reaches its parent the same way, in plain text. A
blob that does not open (another server's, another key's) becomes a short note, with a warning in the log; a
value that is no blob at all (Codex forwards the plain task when a server did not seal it) is read as it is.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable
from typing import Any

from proxy.responses.request.content import AGENT_IMAGE_NOTE, noted_image
from proxy.responses.request.unseal import Unsealer
from proxy.responses.sealing import AGENT_MESSAGE, Sealer
from tools.definitions import FunctionTool

# What a blob is written with (base64url, as ours and OpenAI's are); a value with other characters is plain text.
_BLOB_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-_=")
# What the model reads in place of a sealed message this server cannot open.
UNREADABLE_NOTE = "[A sealed message from another agent was here; this server cannot open it.]"


def encrypted_parameters(tools: Iterable[FunctionTool]) -> dict[tuple[str | None, str], tuple[str, ...]]:
    """(namespace, name) of each tool with top-level parameters marked `"encrypted": true` -> their names."""
    found = {}
    for tool in tools:
        properties = (tool.parameters or {}).get("properties")
        if isinstance(properties, dict):
            names = tuple(name for name, schema in properties.items()
                          if isinstance(schema, dict) and schema.get("encrypted") is True)
            if names:
                found[(tool.namespace, tool.name)] = names
    return found


class ArgumentSealer:
    """Seals the encrypted parameters of the calls a response makes."""

    def __init__(self, sealer: Sealer, tools: Iterable[FunctionTool]) -> None:
        self._sealer = sealer
        self._parameters = encrypted_parameters(tools)

    def parameters(self, namespace: str | None, name: str) -> tuple[str, ...]:
        return self._parameters.get((namespace, name), ())

    def seal(self, arguments: str, names: tuple[str, ...]) -> tuple[str, list[str]]:
        """(the arguments with each named string value sealed, the names sealed). Arguments that are no JSON
        object stay as written, and none is sealed: `encrypted_function_args: []` tells Codex they are plain."""
        try:
            values = json.loads(arguments)
        except ValueError:
            return arguments, []
        sealed = [name for name in names if isinstance(values, dict) and isinstance(values.get(name), str)]
        if not sealed:
            return arguments, []
        for name in sealed:
            values[name] = self._sealer.seal(AGENT_MESSAGE, {"text": values[name], "arguments": arguments})
        return json.dumps(values, ensure_ascii=False, separators=(",", ":")), sealed


def call_arguments(item: dict[str, Any], unsealer: Unsealer | None, where: str) -> str:
    """A function call's arguments as the model wrote them, when a parameter holds a blob sealed here (Codex
    sends the call back without `encrypted_function_args`: the blobs' common prefix finds them), else as sent."""
    arguments = item["arguments"]
    if unsealer is None or unsealer.prefix not in arguments:
        return arguments
    try:
        values = json.loads(arguments)
    except ValueError:
        return arguments
    for value in values.values() if isinstance(values, dict) else ():
        if isinstance(value, str) and value.startswith(unsealer.prefix):
            payload = unsealer.agent_message(value, where)
            if payload is not None and isinstance(payload.get("arguments"), str):
                return payload["arguments"]
    return arguments


def agent_message_text(item: dict[str, Any], unsealer: Unsealer | None, where: str) -> str:
    """The text of an `agent_message` item: its text parts, its sealed parts opened, an image as a note."""
    texts = []
    for index, part in enumerate(item["content"]):
        if part["type"] == "input_text":
            texts.append(part["text"])
            continue
        if part["type"] == "input_image":
            texts.append(noted_image(AGENT_IMAGE_NOTE, f"{where}.content[{index}]", "an agent message"))
            continue
        blob = part["encrypted_content"]
        if not _BLOB_CHARACTERS.issuperset(blob):  # no blob: plain text that a server before us let through
            texts.append(blob)
            continue
        payload = unsealer.agent_message(blob, f"{where}.content[{index}]") if unsealer is not None else None
        text = payload.get("text") if payload is not None else None
        texts.append(text if isinstance(text, str) else UNREADABLE_NOTE)
    return "".join(texts)
