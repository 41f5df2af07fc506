"""The 2026 Responses dialect that Codex speaks, end to end with the openai SDK: namespace and custom (freeform)
tools, built-in tools nobody runs here, and images in tool outputs (issue 17)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.engines.scripted import scripted_engine
from proxy.responses.request import IMAGE_NOTE
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import ANSWER, client_for
from tests.test_mcp_loop import validate_response

IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
VIEW_CALL = {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": '{"path":"a.png"}'}


def post(server: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/responses", json={"model": MODEL, **body}, timeout=30)


def test_an_image_in_a_tool_output_becomes_a_note(serve: Callable[..., LiveServer], vocab: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER, ANSWER]))
    server = serve(engine=engine)
    output = {"type": "function_call_output", "call_id": "call_1",
              "output": [{"type": "input_text", "text": "Here it is:"}, IMAGE]}
    history = [{"role": "user", "content": "Look at a.png"}, VIEW_CALL, output]
    with caplog.at_level(logging.INFO, logger="harmony_proxy"):
        first = client_for(server).responses.create(model=MODEL, input=history, store=False)
    assert first.status == "completed"
    prompt = vocab.decode(engine.requests[0].prompt_token_ids)
    assert f"<|message|>Here it is:\n{IMAGE_NOTE}<|end|>" in prompt and "base64" not in prompt
    assert any("image in a tool output" in record.message for record in caplog.records)
    # the image stays in the client's history: the next turn goes on too
    second = post(server, {"input": [*history, {"role": "user", "content": "And now?"}]})
    assert second.status_code == 200, second.text
    validate_response(second.json())


def test_an_image_in_a_user_message_is_still_refused(serve: Callable[..., LiveServer]) -> None:
    response = post(serve(completions=[ANSWER]), {"input": [{"role": "user", "content": [IMAGE]}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_content" and error["param"] == "input[0].content[0]"
    assert "text only" in error["message"]
