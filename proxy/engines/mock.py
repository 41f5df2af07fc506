"""The mock engine: a deterministic stand-in with no weights, so the server runs on any machine.

Like a model it reads only its prompt (plus the output constraint an engine is given: the tools' schemas, which it
reads back from the prompt's declarations when no constraint carries them, behind an upstream) and writes Harmony:
a short analysis about the request, then one of
- a call to a declared tool, when the user names it or tool_choice requires one (arguments valid against
  the tool's JSON Schema);
- a summary of a tool result, when the conversation ends with one;
- a final answer that says plainly it comes from a mock (JSON valid against the response format, if any).

Under a constraint it generates as a constrained engine does: every token goes through the compiled grammar's
token mask (llguidance), and a token the mask forbids is replaced by an allowed one (see `constrained`), so
compiling, masking, parsing and serializing all run for real.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

import llguidance

from parsers.vocab import Vocab
from proxy.engines.base import EngineError, GenerationRequest
from proxy.engines.declared_tools import declared_tools
from proxy.engines.matcher import GrammarError, GrammarMatchers
from proxy.engines.playback import PlaybackEngine
from tools.arguments import example_arguments
from tools.definitions import FunctionTool, ResponseFormat

logger = logging.getLogger("harmony_proxy.engine")

_EFFORT = re.compile(r"^Reasoning: (\w+)$", re.MULTILINE)
# Past the planned tokens, how many more a constrained completion may take to reach the end of its grammar.
_MAX_REPAIR_TOKENS = 512
# How far ahead in its plan the mock looks for a token the grammar allows, when the next one is forbidden.
_RESYNC_TOKENS = 32
# What the mock falls back on where the grammar forbids its plan, best first: endings, then small JSON values.
_FALLBACK_TEXTS = ('"}', "}", '"', "]", "0", "null", "true", ",", ":", "{", "[", "a")


def mock_engine(vocab: Vocab, token_delay: float = 0.0, tokens_per_step: int = 1,
                matchers: GrammarMatchers | None = None) -> PlaybackEngine:
    """`matchers` lets several engines of one process share the grammar tokenizer (a second to build)."""
    matchers = matchers or GrammarMatchers(vocab)
    # Built now, at start-up, not by the first request with a grammar: building it holds the GIL for a second or
    # two (tiktoken and llguidance), which would stall every stream, worker thread or not.
    matchers.tokenizer()
    return PlaybackEngine("mock", MockModel(vocab, matchers).write_off_loop, token_delay, tokens_per_step)


class MockModel:
    def __init__(self, vocab: Vocab, matchers: GrammarMatchers | None = None) -> None:
        self._vocab = vocab
        self._matchers = matchers or GrammarMatchers(vocab)
        special = vocab.special
        self._fallbacks = [special.call, special.end] + [
            tokens[0] for tokens in map(vocab.encode, _FALLBACK_TEXTS) if len(tokens) == 1
        ]

    async def write_off_loop(self, request: GenerationRequest) -> list[int]:
        """`write`, in a worker thread when a grammar is to be compiled and followed (milliseconds of work)."""
        if request.constraint.grammar is None:
            return self.write(request)
        try:
            return await asyncio.to_thread(self.write, request)
        except GrammarError as exc:  # past llguidance's limits (matcher.py): the client's grammar, a 400
            raise EngineError(f"The output grammar cannot be compiled within this server's limits: {exc}"[:500],
                              status=400, code="invalid_grammar") from None

    def write(self, request: GenerationRequest) -> list[int]:
        """The completion's token ids, under the request's grammar if it has one."""
        planned = self.plan(request)
        grammar = request.constraint.grammar
        if grammar is None:
            return planned
        return self.constrained(self._matchers.matcher(grammar), planned)

    def constrained(self, matcher: llguidance.LLMatcher, planned: list[int]) -> list[int]:
        """Generate `planned` through the grammar: each token is checked against the mask; one the mask forbids
        is replaced by the first allowed of a fixed preference list (else the lowest allowed id), and past the
        plan the same choice runs until the grammar ends. Deterministic, and always a completion the grammar
        accepts unless it is cut off by the repair bound."""
        eos = self._vocab.special.return_
        out: list[int] = []
        position = 0
        while len(out) < len(planned) + _MAX_REPAIR_TOKENS and not matcher.is_stopped():
            mask = matcher.compute_bitmask()
            wanted = planned[position] if position < len(planned) else None
            position += 1
            if wanted is not None and not _allowed(mask, wanted):
                # Off the grammar: pick the plan up again at its next token the grammar allows, if one is near
                # (a line a freeform grammar forbids is skipped), as a model steered back would.
                ahead = next((at for at in range(position, min(position + _RESYNC_TOKENS, len(planned)))
                              if _allowed(mask, planned[at])), None)
                if ahead is not None:
                    logger.debug("mock engine: the grammar forbids token %d; went on at planned token %d", wanted,
                                 ahead)
                    wanted, position = planned[ahead], ahead + 1
            if wanted is not None and _allowed(mask, wanted):
                token = wanted
            else:
                token = self._fallback(matcher, mask)
                if token is None:  # a dead end (a schema no JSON satisfies): stop, as a model would hit max_tokens
                    break
                if wanted is not None:
                    logger.debug("mock engine: the grammar forbids token %d; wrote %d instead", wanted, token)
            if token == eos:  # the grammar is complete: EOS ends the final answer
                out.append(token)
                break
            if not matcher.consume_token(token):  # never expected: the token was allowed
                logger.warning("mock engine: grammar matcher failed: %s", matcher.get_error())
                break
            out.append(token)
            if token in self._vocab.stop_token_ids:
                break
        if (not out or out[-1] not in self._vocab.stop_token_ids) and _allowed(matcher.compute_bitmask(), eos):
            out.append(eos)  # the grammar ended (a JSON answer's last brace): only EOS may follow
        return out

    def _fallback(self, matcher: llguidance.LLMatcher, mask: bytes) -> int | None:
        eos = self._vocab.special.return_
        if _allowed(mask, eos) and matcher.is_accepting():
            return eos
        forced = matcher.compute_ff_tokens()
        if forced:
            return forced[0]
        for token in self._fallbacks:
            if _allowed(mask, token):
                return token
        bits = int.from_bytes(mask, "little")
        return (bits & -bits).bit_length() - 1 if bits else None

    def plan(self, request: GenerationRequest) -> list[int]:
        """The completion the mock means to write: Harmony markup as special tokens, anything echoed as plain
        text, so text from the request can never turn into markup."""
        messages = self._messages(request.prompt_token_ids)
        system = next((body for author, body in messages if author == "system"), "")
        effort = _EFFORT.search(system)
        last_author, last_body = messages[-1] if messages else ("user", "")
        constraint = request.constraint
        # The tools come with the output constraint in front of clients; behind an upstream (raw completions)
        # only the prompt declares them, so they are read from it, as a model reads them.
        developer = next((body for author, body in messages if author == "developer"), "")
        tools = constraint.tools or declared_tools(developer)
        tool = _chosen_tool(tools, constraint.tool_choice.mode, constraint.tool_choice.name, last_body)
        about = (
            f"Mock engine, not a model. The prompt has {_count(len(messages), 'message')} and "
            f"{_count(len(tools), 'tool')}; reasoning effort {effort.group(1) if effort else 'unknown'}."
        )
        answer_format = constraint.response_format
        namespaces = {"functions", *(tool.namespace for tool in tools if tool.namespace)}
        if last_author.partition(".")[0] in namespaces and " to=assistant" in last_author \
                and not constraint.tool_choice.forces_call:
            name = last_author.split(" ")[0].removeprefix("functions.")
            summary = f"[mock] The tool {name} returned: {_clip(last_body)}"
            return self._analysis(f"{about} The last message is the result of {name}; summarize it.") + self._final(
                summary, answer_format
            )
        if tool is not None and tool.freeform is not None:  # a custom tool: what follows its name, as raw input
            harmony = self._vocab.encode_harmony
            return (
                self._analysis(f"{about} Calling {tool.name}.")
                + harmony(f"<|start|>assistant<|channel|>commentary to={tool.recipient}<|message|>")
                + self._vocab.encode(_after_name(last_body, tool.name))
                + harmony("<|call|>")
            )
        if tool is not None:
            arguments = json.dumps(example_arguments(tool.parameters), ensure_ascii=False)
            harmony = self._vocab.encode_harmony
            return (
                self._analysis(f"{about} Calling {tool.name}.")
                + harmony(f"<|start|>assistant<|channel|>commentary to={tool.recipient} <|constrain|>json<|message|>")
                + self._vocab.encode(arguments)
                + harmony("<|call|>")
            )
        return self._analysis(f"{about} Answering directly.") + self._final(
            f"[mock] This is harmony-proxy's mock engine; no model is loaded. You said: {_clip(last_body)}",
            answer_format,
        )

    def _analysis(self, text: str) -> list[int]:
        harmony = self._vocab.encode_harmony
        return harmony("<|channel|>analysis<|message|>") + self._vocab.encode(text) + harmony("<|end|>")

    def _final(self, text: str, answer_format: ResponseFormat | None = None) -> list[int]:
        """A final answer: `text`, or with a response format JSON valid against it (`text` in a string field of
        a JSON object, where the schema leaves one free)."""
        if answer_format is not None:
            text = json.dumps(_json_answer(answer_format, text), ensure_ascii=False)
        harmony = self._vocab.encode_harmony
        return (harmony("<|start|>assistant<|channel|>final<|message|>") + self._vocab.encode(text)
                + harmony("<|return|>"))

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


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _chosen_tool(tools: tuple[FunctionTool, ...], mode: str, name: str | None, user_text: str) -> FunctionTool | None:
    if mode in ("function", "custom"):
        return next((tool for tool in tools if tool.name == name), None)
    mentioned = next((tool for tool in tools if tool.name in user_text), None)
    if mode == "required":
        return mentioned or (tools[0] if tools else None)
    return mentioned if mode == "auto" else None


def _after_name(text: str, name: str) -> str:
    """What the user wrote after the tool's name (past a colon and one line break): a custom tool's input."""
    at = text.find(name)
    rest = text[at + len(name):] if at >= 0 else ""
    return rest.removeprefix(":").removeprefix(" ").removeprefix("\n")


def _allowed(mask: bytes, token: int) -> bool:
    return token >> 3 < len(mask) and bool(mask[token >> 3] >> (token & 7) & 1)


def _json_answer(answer_format: ResponseFormat, text: str) -> object:
    if answer_format.kind == "json_object":
        return {"answer": text}
    return example_arguments(answer_format.schema)


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
