"""The Vercel AI SDK (node) running a multi-step tool loop against the real server: tests/node/ai_sdk.mjs.

The SDK's versions are pinned in tests/node/package-lock.json; `npm ci` installs them once into
tests/node/node_modules (git-ignored) and again only when the lock file changes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.engines.scripted import scripted_engine
from tests.conftest import LiveServer
from tests.engines import Recording
from tests.node_tools import node_env, npm_installed
from tests.test_e2e_chat import ANSWER, CALL

NODE_DIR = Path(__file__).resolve().parent / "node"
CALLED = 'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
TOOL_RESULT = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
FIRST_REASONING = "<|channel|>analysis<|message|>Need the weather.<|end|>"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    return npm_installed(NODE_DIR)


def run_script(server: LiveServer, provider: str, mode: str) -> dict[str, Any]:
    done = subprocess.run(["node", "ai_sdk.mjs", server.base_url, provider, mode], check=False, cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=60, env=node_env())
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output from node (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(lines[-1])


# Which reasoning each provider shows, and whether it sends the first step's reasoning back with the tool result
# (gpt-oss should see its chain of thought until the tool loop ends): @ai-sdk/openai's chat model reads no
# `reasoning_content`; its responses model shows reasoning from summary events and refers back to the stored
# reasoning item with an `item_reference`; with `store: false` it asks for `reasoning.encrypted_content` and sends
# the reasoning back as that blob alone (no text), which the server opens (proxy/responses/sealing.py).
PROVIDERS = {
    "openai-compatible": (["Need the weather.", "Easy."], True),
    "openai-chat": ([None, None], False),
    "openai-responses": (["Need the weather.", "Easy."], True),
    "openai-responses-store-false": (["Need the weather.", "Easy."], True),
}


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_multi_step_tool_loop(
    serve: Callable[..., LiveServer], vocab: Any, node_modules: Path, provider: str, mode: str
) -> None:
    engine = Recording(scripted_engine(vocab, [CALL, ANSWER]))
    server = serve(engine=engine)  # the responses providers ask for summaries (reasoningSummary: "auto")
    output = run_script(server, provider, mode)
    assert output["error"] is None, output["error"]
    result = output["result"]
    reasoning, replays_reasoning = PROVIDERS[provider]
    assert result["calls"] == ["Paris"]
    assert result["text"] == "It is 18C."
    assert [step["reasoning"] for step in result["steps"]] == reasoning
    first, last = result["steps"]
    assert first["finishReason"] == "tool-calls" and first["text"] == ""
    assert first["toolCalls"] == [{"name": "get_weather", "input": {"city": "Paris"}}]
    assert first["toolResults"] == [{"name": "get_weather", "output": "sunny, 18 degrees in Paris"}]
    assert last["finishReason"] == "stop" and last["text"] == "It is 18C." and last["toolCalls"] == []
    if mode == "stream":
        parts = result["parts"]
        assert parts["tool-call"] == 1 and parts["tool-result"] == 1 and parts["finish-step"] == 2
        assert parts["tool-input-delta"] > 1  # the arguments arrived as they were generated
        # One delta per generated token: the scripted engine sends one token a step.
        reasoning_tokens = sum(len(vocab.encode(text)) for text in reasoning if text)
        assert parts["text-delta"] == len(vocab.encode("It is 18C."))
        assert parts.get("reasoning-delta", 0) == reasoning_tokens

    assert len(engine.requests) == 2
    assert all("Reasoning: low" in vocab.decode(request.prompt_token_ids) for request in engine.requests)
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert "<|start|>user<|message|>What is the weather in Paris?<|end|>" in second_prompt
    assert CALLED in second_prompt
    assert TOOL_RESULT + "sunny, 18 degrees in Paris<|end|>" in second_prompt
    assert (FIRST_REASONING in second_prompt) == replays_reasoning
