"""Input items as OpenAI lists them back (`GET .../input_items`): each checked against its type's schema, given an
id and a type, string content made text parts, an image's `detail` OpenAI's default (`auto`) when not given; a text
part without its text is a 400, as OpenAI answers."""

from __future__ import annotations

from typing import Any

from proxy.errors import invalid_request
from proxy.ids import checked_id, new_id
from proxy.responses.output.server_items import ID_PREFIXES
from proxy.responses.request.content import TEXT_PARTS
from proxy.responses.request.schema import ITEMS, REFUSED_ITEMS
from proxy.validation import check, compile_schema

_ITEM = {kind: compile_schema(schema) for kind, schema in ITEMS.items()}
_ID_PREFIX = {"message": "msg_", "reasoning": "rs_", "function_call": "fc_", "function_call_output": "fco_",
              "additional_tools": "at_", "compaction": "cmp_", "compaction_trigger": "cmpt_",
              "custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_", "configuration_update": "cfg_",
              "agent_message": "amsg_", **ID_PREFIXES}


def normalize_items(raw: list[Any], param: str) -> list[dict[str, Any]]:
    """Input items as OpenAI lists them back: each with an id and a type, string content as text parts."""
    return [_normalize(item, f"{param}[{position}]") for position, item in enumerate(raw)]


def refuse_duplicates(earlier: list[str], items: list[dict[str, Any]], param: str) -> None:
    seen = set(earlier)
    for position, item in enumerate(items):
        if item["id"] in seen:
            raise invalid_request(f"Duplicate item found with id {item['id']}. Remove duplicate items from your "
                                  "input and try again.", param=f"{param}[{position}]")
        seen.add(item["id"])


def input_list(raw: Any) -> list[Any]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return raw


def _normalize(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise invalid_request("Each input item must be an object.", param=where)
    kind = item.get("type") or ("message" if "role" in item else "item_reference")
    if not isinstance(kind, str) or kind not in _ITEM:
        reason = REFUSED_ITEMS.get(kind) if isinstance(kind, str) else None
        raise invalid_request(f"Input item type {kind!r} is not supported" + (f": {reason}." if reason else "."),
                              param=f"{where}.type", code="invalid_value")
    check({**item, "type": kind}, _ITEM[kind], where)
    if item.get("id") is not None:
        checked_id(item["id"], f"{where}.id")
    item = {**item, "type": kind}
    if kind == "item_reference":
        return item
    if kind == "message":
        part = "output_text" if item["role"] == "assistant" else "input_text"
        content = item["content"]
        if isinstance(content, str):
            content = [{"type": part, "text": content, **({"annotations": []} if part == "output_text" else {})}]
        # An image's `detail` is OpenAI's default when not given: its SDKs' types require it on what comes back.
        content = [{**piece, "detail": "auto"} if piece["type"] == "input_image" and piece.get("detail") is None
                   else piece for piece in content]
        for index, piece in enumerate(content):
            if piece["type"] == "input_image" and item["role"] == "user":
                continue  # read as a note (content.py)
            if piece["type"] not in TEXT_PARTS and piece["type"] != "refusal":
                raise invalid_request(f"Content part type {piece['type']!r} is not supported: gpt-oss takes text only.",
                                      param=f"{where}.content[{index}]", code="unsupported_content")
            _require_text(piece, f"{where}.content[{index}]")
        item = {**item, "content": content, "status": item.get("status") or "completed"}
    elif kind in ("function_call_output", "custom_tool_call_output") and isinstance(item["output"], list):
        for index, piece in enumerate(item["output"]):
            _require_text(piece, f"{where}.output[{index}]")
    return {"id": item.get("id") or new_id(_ID_PREFIX[kind]), **{key: item[key] for key in item if key != "id"}}


def _require_text(part: dict[str, Any], where: str) -> None:
    """A text part without its text (or a refusal without the refusal) is malformed, as OpenAI answers."""
    field = "refusal" if part["type"] == "refusal" else "text" if part["type"] in TEXT_PARTS else None
    if field is not None and field not in part:
        raise invalid_request(f"Missing required parameter: '{where}.{field}'.", param=f"{where}.{field}",
                              code="missing_required_parameter")
