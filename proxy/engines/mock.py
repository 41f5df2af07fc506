"""The mock engine: a deterministic stand-in with no weights, so the server runs on any machine.

Like a model it reads only its prompt (plus the output constraint an engine is given) and writes Harmony:
a short analysis about the request, then one of
- a call to a declared tool, when the user names it or tool_choice requires one (arguments valid against
  the tool's JSON Schema);
- a summary of a tool result, when the conversation ends with one;
- a final answer that says plainly it comes from a mock.
"""

from __future__ import annotations

import json
import re

from parsers.vocab import Vocab
from proxy.engines.base import GenerationRequest
from proxy.engines.playback import PlaybackEngine
from tools.arguments import example_arguments
from tools.definitions import FunctionTool

_EFFORT = re.compile(r"^Reasoning: (\w+)$", re.MULTILINE)


def mock_engine(vocab: Vocab, token_delay: float = 0.0, tokens_per_step: int = 1) -> PlaybackEngine:
    return PlaybackEngine("mock", MockModel(vocab).write, token_delay, tokens_per_step)


class MockModel:
    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab

    def write(self, request: GenerationRequest) -> list[int]:
        """The completion's token ids: Harmony markup as special tokens, anything echoed as plain text, so text
        from the request can never turn into markup."""
        messages = self._messages(request.prompt_token_ids)
        system = next((body for author, body in messages if author == "system"), "")
        effort = _EFFORT.search(system)
        last_author, last_body = messages[-1] if messages else ("user", "")
        constraint = request.constraint
        tool = _chosen_tool(constraint.tools, constraint.tool_choice.mode, constraint.tool_choice.name, last_body)
        about = (
            f"Mock engine, not a model. The prompt has {len(messages)} messages and {len(constraint.tools)} "
            f"tools; reasoning effort {effort.group(1) if effort else 'unknown'}."
        )
        if last_author.startswith("functions.") and not constraint.tool_choice.forces_call:
            name = last_author.split(" ")[0][len("functions.") :]
            return self._analysis(f"{about} The last message is the result of {name}; summarize it.") + self._final(
                f"[mock] The tool {name} returned: {_clip(last_body)}"
            )
        if tool is not None:
            arguments = json.dumps(example_arguments(tool.parameters), ensure_ascii=False)
            harmony = self._vocab.encode_harmony
            return (
                self._analysis(f"{about} Calling {tool.name}.")
                + harmony(f"<|start|>assistant<|channel|>commentary to=functions.{tool.name} <|constrain|>json<|message|>")
                + self._vocab.encode(arguments)
                + harmony("<|call|>")
            )
        return self._analysis(f"{about} Answering directly.") + self._final(
            f"[mock] This is harmony-proxy's mock engine; no model is loaded. You said: {_clip(last_body)}"
        )

    def _analysis(self, text: str) -> list[int]:
        harmony = self._vocab.encode_harmony
        return harmony("<|channel|>analysis<|message|>") + self._vocab.encode(text) + harmony("<|end|>")

    def _final(self, text: str) -> list[int]:
        harmony = self._vocab.encode_harmony
        return harmony("<|start|>assistant<|channel|>final<|message|>") + self._vocab.encode(text) + harmony("<|return|>")

    def _messages(self, prompt: list[int]) -> list[tuple[str, str]]:
        """(header, body) of each complete message in the prompt, read at the token level."""
        special = self._vocab.special
        messages = []
        start = None
        body = None
        for position, token in enumerate(prompt):
            if token == special.start:
                start, body = position + 1, None
            elif token == special.message and start is not None:
                body = position + 1
            elif token in (special.end, special.call, special.return_) and start is not None and body is not None:
                header = self._vocab.decode([t for t in prompt[start : body - 1] if not self._vocab.is_special(t)])
                messages.append((header.strip(), self._vocab.decode(prompt[body:position])))
                start = body = None
        return messages


def _chosen_tool(tools: tuple[FunctionTool, ...], mode: str, name: str | None, user_text: str) -> FunctionTool | None:
    if mode == "function":
        return next((tool for tool in tools if tool.name == name), None)
    mentioned = next((tool for tool in tools if tool.name in user_text), None)
    if mode == "required":
        return mentioned or (tools[0] if tools else None)
    return mentioned if mode == "auto" else None


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
