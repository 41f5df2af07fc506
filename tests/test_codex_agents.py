"""Codex's sub-agents (Multi-Agent V2) against the real server: the server's catalog turns them on, the parent's
task reaches the sub-agent through a sealed parameter, the sub-agent's answer reaches the parent, and the turn
completes; over HTTP and over the WebSocket mode (tests/test_codex.py's fixtures)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai.types.beta.beta_response_input_item_param import AgentMessage as BetaAgentMessage
from pydantic import TypeAdapter

from proxy.engines.base import GenerationRequest
from proxy.engines.playback import PlaybackEngine
from proxy.responses.agent_messages import UNREADABLE_NOTE
from proxy.responses.request.content import AGENT_IMAGE_NOTE
from proxy.responses.sealing import AGENT_MESSAGE, Sealer
from tests.conftest import LiveServer
from tests.engines import Recording
from tests.test_codex import MCP_ANSWER, MCP_CALL, Codex, codex, codex_binary, items, turn_completed  # noqa: F401
from tests.test_codex_dialect import post, stream

TASK = '{"task_name":"counter","message":"Count the files in the project."}'
SPAWN = ("<|channel|>analysis<|message|>Ask a helper.<|end|><|start|>assistant<|channel|>commentary "
         f"to=collaboration.spawn_agent <|constrain|>json<|message|>{TASK}<|call|>")
WAIT = ("<|channel|>analysis<|message|>Wait for it.<|end|><|start|>assistant<|channel|>commentary "
        'to=collaboration.wait_agent <|constrain|>json<|message|>{"timeout_ms":20000}<|call|>')
PARENT_ANSWER = ("<|channel|>analysis<|message|>It answered.<|end|><|start|>assistant<|channel|>final<|message|>"
                 "The helper counted 2 files.<|return|>")
CHILD_ANSWER = ("<|channel|>analysis<|message|>Count.<|end|><|start|>assistant<|channel|>final<|message|>"
                "There are 2 files.<|return|>")
KEY = "the key of these tests"
NEW_TASK = "Message Type: NEW_TASK\nTask name: /root/counter\nSender: /root\nPayload:\nCount the files in the project."
FINAL_ANSWER = "Message Type: FINAL_ANSWER\nTask name: /root\nSender: /root/counter\nPayload:\nThere are 2 files."


def agents_engine(vocab: Any, parent: list[str], child: list[str]) -> PlaybackEngine:
    """Plays the parent's completions to the parent and the sub-agent's to the sub-agent, in whatever order their
    requests come: the sub-agent's prompt holds the task it was given."""
    parents, children = iter(parent), iter(child)

    def author(request: GenerationRequest) -> list[int]:
        is_child = "Message Type: NEW_TASK" in vocab.decode(request.prompt_token_ids)
        return vocab.encode_harmony(next(children if is_child else parents))

    return PlaybackEngine("agents", author)


def test_a_sub_agent_gets_its_task_and_the_parent_its_answer(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex]  # noqa: F811 (the fixture)
) -> None:
    engine = Recording(agents_engine(vocab, [SPAWN, WAIT, PARENT_ANSWER], [CHILD_ANSWER]))
    server = serve(engine=engine, reasoning_key=KEY)
    events = codex(server).exec("Count the files with a helper.")
    turn_completed(events)
    assert [message["text"] for message in items(events, "agent_message")] == ["The helper counted 2 files."]
    (wait,) = items(events, "collab_tool_call")
    assert (wait["tool"], wait["status"]) == ("wait", "completed")

    prompts = [vocab.decode(request.prompt_token_ids) for request in engine.requests]
    children = [prompt for prompt in prompts if NEW_TASK in prompt]
    parents = [prompt for prompt in prompts if NEW_TASK not in prompt]
    assert len(children) == 1 and len(parents) == 3
    sealed = Sealer(KEY).prefix  # how the server's blobs begin
    # The sub-agent read its task: Codex carried it sealed and the server opened it, as a user message.
    assert f"<|start|>user<|message|>{NEW_TASK}<|end|><|start|>assistant" in children[0]
    # The parent's call renders as the model wrote it (in the sub-agent's forked history too), and the sub-agent's
    # answer follows the wait.
    for prompt in [*parents[1:], *children]:
        assert f"to=collaboration.spawn_agent <|constrain|>json<|message|>{TASK}<|call|>" in prompt
    assert not any(sealed in prompt for prompt in prompts)
    assert parents[2].endswith(f"<|start|>user<|message|>{FINAL_ANSWER}<|end|><|start|>assistant")


# -- the items through the API (the openai SDK's beta types for their shape) -----------------------------------------

COLLABORATION = {"type": "namespace", "name": "collaboration", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent.", "strict": False,
     "parameters": {"type": "object", "properties": {
         "task_name": {"type": "string"},
         "message": {"type": "string", "description": "The task.", "encrypted": True}},
         "required": ["task_name", "message"], "additionalProperties": False}},
    {"type": "function", "name": "wait_agent", "description": "Wait.", "strict": False,
     "parameters": {"type": "object", "properties": {"timeout_ms": {"type": "number"}}}}]}
HEADER = "Message Type: NEW_TASK\nTask name: /root/counter\nSender: /root\nPayload:\n"


def agent_message(*parts: dict[str, Any], author: str = "/root", recipient: str = "/root/counter") -> dict[str, Any]:
    """An agent_message input item, checked against the openai SDK's (beta) type."""
    item = {"type": "agent_message", "author": author, "recipient": recipient, "content": list(parts)}
    TypeAdapter(BetaAgentMessage).validate_python(item)
    return item


def test_an_encrypted_parameter_leaves_sealed_and_an_agent_message_opens(
    serve: Callable[..., LiveServer], vocab: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Recording(agents_engine(vocab, [SPAWN, SPAWN, PARENT_ANSWER, PARENT_ANSWER], [CHILD_ANSWER] * 2))
    server = serve(engine=engine, reasoning_key=KEY)
    prefix = Sealer(KEY).prefix
    ask = {"role": "user", "content": "Count the files with a helper."}
    events = stream(server, {"input": [ask], "tools": [COLLABORATION]})
    call = events[-1]["response"]["output"][1]
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn_agent", "collaboration")
    assert call["encrypted_function_args"] == ["message"]  # what Codex reads (codex-rs ResponseItem::FunctionCall)
    arguments = json.loads(call["arguments"])
    assert arguments["task_name"] == "counter" and arguments["message"].startswith(prefix)
    # streamed as one delta once the call is whole: the task never streams in the clear
    deltas = [event["delta"] for event in events if event["type"] == "response.function_call_arguments.delta"]
    assert deltas == [call["arguments"]] and "Count the files" not in json.dumps(events)
    done = next(event for event in events if event["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == call["arguments"]
    # non-streaming gives the same item (a fresh nonce: another blob of the same task)
    same = post(server, {"input": [ask], "tools": [COLLABORATION]}).json()["output"][1]
    assert same.keys() == call.keys() and same["encrypted_function_args"] == ["message"]

    # The sub-agent's request: Codex hands the blob on as an agent_message; the server opens it.
    task = agent_message({"type": "input_text", "text": HEADER},
                         {"type": "encrypted_content", "encrypted_content": arguments["message"]})
    response = post(server, {"input": [task]})
    assert response.status_code == 200, response.text
    assert f"<|start|>user<|message|>{NEW_TASK}<|end|>" in vocab.decode(engine.requests[2].prompt_token_ids)
    assert response.json()["output"][-1]["content"][0]["text"] == "There are 2 files."

    # The parent's next request: the call comes back without encrypted_function_args (as Codex sends it), then
    # the sub-agent's answer in the clear; the call renders as the model wrote it.
    history = [ask, {key: call[key] for key in ("type", "call_id", "name", "namespace", "arguments")},
               {"type": "function_call_output", "call_id": call["call_id"], "output": '{"task_name":"/root/counter"}'},
               agent_message({"type": "input_text", "text": FINAL_ANSWER}, author="/root/counter", recipient="/root")]
    response = post(server, {"input": history, "tools": [COLLABORATION]})
    assert response.status_code == 200, response.text
    prompt = vocab.decode(engine.requests[3].prompt_token_ids)
    assert f"to=collaboration.spawn_agent <|constrain|>json<|message|>{TASK}<|call|>" in prompt
    assert prompt.endswith(f"<|start|>user<|message|>{FINAL_ANSWER}<|end|><|start|>assistant") and prefix not in prompt


def test_a_blob_that_does_not_open_becomes_a_note(serve: Callable[..., LiveServer], vocab: Any,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    engine = Recording(agents_engine(vocab, [], [CHILD_ANSWER] * 4))
    server = serve(engine=engine, reasoning_key=KEY)
    other = Sealer("another key, another server").seal(AGENT_MESSAGE, {"text": "Secret task."})
    # a foreign blob, one of OpenAI's shape, and the plain task another server let through (Codex forwards it)
    for blob, read in ((other, UNREADABLE_NOTE), ("gAAAAABpZ2V0", UNREADABLE_NOTE),
                       ("Count the files in the project.", "Count the files in the project.")):
        task = agent_message({"type": "input_text", "text": HEADER}, {"type": "encrypted_content",
                                                                      "encrypted_content": blob})
        response = post(server, {"input": [task]})
        assert response.status_code == 200, response.text
        assert f"{HEADER}{read}<|end|>" in vocab.decode(engine.requests[-1].prompt_token_ids)
    assert sum("ignored the encrypted_content of a agent_message item" in record.getMessage()
               for record in caplog.records) == 2
    image = agent_message({"type": "input_text", "text": HEADER},
                          {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="})
    assert post(server, {"input": [image]}).status_code == 200
    assert f"{HEADER}{AGENT_IMAGE_NOTE}<|end|>" in vocab.decode(engine.requests[-1].prompt_token_ids)


@pytest.mark.parametrize("item", [
    {"type": "agent_message", "author": "/root", "content": [{"type": "input_text", "text": "Hi"}]},
    {"type": "agent_message", "author": "/root", "recipient": "/root/a", "content": "Hi"},
    {"type": "agent_message", "author": "/root", "recipient": "/root/a", "content": [{"type": "output_text",
                                                                                      "text": "Hi"}]},
    {"type": "agent_message", "author": "/root", "recipient": "/root/a",
     "content": [{"type": "encrypted_content", "encrypted_content": 3}]},
    {"type": "function_call", "call_id": "c", "name": "spawn_agent", "arguments": "{}",
     "encrypted_function_args": "message"},
])
def test_malformed_agent_items_are_400s(serve: Callable[..., LiveServer], item: dict[str, Any]) -> None:
    response = post(serve(completions=[CHILD_ANSWER]), {"input": [{"role": "user", "content": "Hi"}, item]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("input[1]")


def test_the_catalog_leaves_responses_lite_off(serve: Callable[..., LiveServer], vocab: Any, codex_binary: Path,  # noqa: F811
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why the catalog says `use_responses_lite: false`: with it on, Codex 0.171 declares its tools in an
    # additional_tools item as a namespace named `functions` (Harmony's own namespace of plain functions, a name
    # no client namespace may take) and asks `reasoning.context: "all_turns"`; both are refused, so every turn would
    # fail. Off (the catalog as served, test_a_sub_agent_gets_its_task_and_the_parent_its_answer), turns complete.
    import proxy.status
    from proxy.codex_catalog import codex_model_info

    monkeypatch.setattr(proxy.status, "codex_model_info",
                        lambda config: {**codex_model_info(config), "use_responses_lite": True})
    engine = Recording(agents_engine(vocab, [PARENT_ANSWER], []))
    events = Codex(codex_binary, tmp_path, serve(engine=engine)).exec("Hi")
    (failed,) = [event for event in events if event["type"] == "turn.failed"]
    error = json.loads(failed["error"]["message"])["error"]
    assert error["param"] in ("reasoning.context", "input[0].tools[0].name"), error
    assert engine.requests == []


def test_the_catalog_leaves_the_search_tool_off(serve: Callable[..., LiveServer], vocab: Any, codex_binary: Path,  # noqa: F811
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why the catalog says `supports_search_tool: false`: with it on, Codex 0.171 leaves its MCP tools out of
    # `tools` and offers a `tool_search` tool that Codex runs itself (`execution: "client"`), so gpt-oss would have
    # to search before any MCP call, in an item (tool_search_call) this server does not write: whether the server
    # refuses `tool_search` or ignores it, the model never sees the MCP tools. Off, they are declared up front
    # (test_codex.py's test_mcp_tool_routed_through_its_namespace).
    import proxy.status
    from proxy.codex_catalog import codex_model_info

    monkeypatch.setattr(proxy.status, "codex_model_info",
                        lambda config: {**codex_model_info(config), "supports_search_tool": True})
    engine = Recording(agents_engine(vocab, [MCP_CALL, MCP_ANSWER], []))
    events = Codex(codex_binary, tmp_path, serve(engine=engine)).exec("What is the weather in Paris?")
    assert not items(events, "mcp_tool_call")
    assert all("namespace mcp__weather" not in vocab.decode(request.prompt_token_ids) for request in engine.requests)
