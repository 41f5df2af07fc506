"""Content parts as the text gpt-oss reads: text as it is, an image as a note saying one was there.

gpt-oss reads text only. An image stays in the client's history (Codex keeps an image attached with `-i` and
what `view_image` returned), so refusing it would fail every later turn of the session and `codex exec resume`
could not recover; the model reads a note in its place instead, and the log says so (an OpenAI-shaped response
has no field for a warning).
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.errors import invalid_request

logger = logging.getLogger("harmony_proxy")

TEXT_PARTS = {"input_text", "output_text", "text"}


def image_note(source: str) -> str:
    """What the model reads in place of an image."""
    return f"[{source} an image here. This model reads text only, so the image is not shown.]"


IMAGE_NOTE = image_note("The tool returned")
USER_IMAGE_NOTE = image_note("The user attached")
AGENT_IMAGE_NOTE = image_note("The other agent sent")


def noted_image(note: str, where: str, what: str) -> str:
    """`note`, the image at `where` (in `what`) replaced by it, said in the log."""
    logger.warning("%s: an image in %s was replaced by a text note (gpt-oss reads text only)", where, what)
    return note


def message_text(content: list[dict[str, Any]], where: str) -> str:
    """A message's parts as text; an image the user attached becomes a note (image_note)."""
    return "\n".join(noted_image(USER_IMAGE_NOTE, f"{where}.content[{index}]", "a user message")
                     if part["type"] == "input_image" else part.get("text") or part.get("refusal") or ""
                     for index, part in enumerate(content))


def output_text(output: Any, where: str) -> str:
    """A tool's output as text; an image in it (Codex's `view_image`) becomes a note (image_note)."""
    if isinstance(output, str):
        return output
    texts = []
    for index, part in enumerate(output):
        if part["type"] == "input_image":
            texts.append(noted_image(IMAGE_NOTE, f"{where}.output[{index}]", "a tool output"))
        elif part["type"] not in TEXT_PARTS:
            raise invalid_request(f"Tool output part type {part['type']!r} is not supported: text only (an image "
                                  "becomes a note).", param=f"{where}.output[{index}]", code="unsupported_content")
        else:
            texts.append(part.get("text", ""))
    return "\n".join(texts)
