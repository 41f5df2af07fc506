"""Stable prompts across a stateless session (issue 18 item 5): a client that resends everything (store=False,
sealed reasoning) gets prompts that each begin with exactly the tokens of the previous prompt and what the model
generated, so an engine's prefix cache serves them. Harmony itself changes two things once a turn ends in a final
answer (parsers/render.py): `<|return|>` is written `<|end|>`, and that turn's analysis is dropped; the check
applies those two rules at the token level, to the tokens the engine really saw and wrote. One compaction in the
session changes the prefix once: the answer after it starts from the compacted window."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

from parsers.vocab import Vocab
from proxy.engines.playback import PlaybackEngine
from proxy.responses.compaction import INSTRUCTION
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.test_e2e_chat import client_for
from tests.test_sealed_reasoning import INCLUDE, KEY, WEATHER

CITIES = ["Paris", "Lyon", "Oslo", "Rome", "Kyiv", "Lima", "Baku", "Doha", "Riga", "Bern"]


def tool_call(vocab: Vocab, turn: int) -> list[int]:
    """An analysis, on even turns a preamble, then a call: what gpt-oss writes in a tool loop. The analysis spells
    "tool" as "to" + "ol", as a sampled model may and the tokenizer would not: only the sealed blob keeps that."""
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" if turn % 2 == 0 else ""
    analysis = [*vocab.encode(f"Turn {turn}: the user wants {CITIES[turn]}; call the to"), *vocab.encode("ol.")]
    assert analysis != vocab.encode(f"Turn {turn}: the user wants {CITIES[turn]}; call the tool.")
    return [*vocab.encode_harmony("<|channel|>analysis<|message|>"), *analysis, *vocab.encode_harmony(
        f"<|end|><|start|>assistant{preamble}<|channel|>commentary to=functions.get_weather <|constrain|>json"
        f'<|message|>{{"city":"{CITIES[turn]}"}}<|call|>')]


def answer(vocab: Vocab, turn: int) -> list[int]:
    return vocab.encode_harmony(f"<|channel|>analysis<|message|>Turn {turn}: the tool said {turn + 10}C.<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>It is {turn + 10}C in {CITIES[turn]}.<|return|>")


def harmony_continuation(vocab: Vocab, prompt: list[int], generated: list[int]) -> list[int]:
    """What the next prompt must begin with: the prompt and the generated tokens, and when they end the turn with
    a final answer, `<|return|>` as `<|end|>` and the analysis messages after the last user message left out."""
    tokens = prompt + generated
    special = vocab.special
    if tokens[-1] != special.return_:
        return tokens
    tokens[-1] = special.end
    starts = [i for i, token in enumerate(tokens) if token == special.start] + [len(tokens)]
    messages = [tokens[a:b] for a, b in pairwise(starts)]
    head = tokens[: starts[0]]
    last_user = max(i for i, message in enumerate(messages) if vocab.decode(message).startswith("<|start|>user"))
    analysis = "<|start|>assistant<|channel|>analysis<|message|>"
    kept = [message for i, message in enumerate(messages)
            if i < last_user or not vocab.decode(message).startswith(analysis)]
    return head + [token for message in kept for token in message]


def test_twenty_stateless_turns_keep_every_prefix_but_once_after_a_compaction(
        serve: Callable[..., LiveServer], vocab: Any) -> None:
    turns, compact_at = 10, 6  # user turns, each a tool call and an answer: 20 requests, and one compaction
    script = iter(completion for turn in range(turns) for completion in (tool_call(vocab, turn), answer(vocab, turn)))
    summary = vocab.encode_harmony("<|channel|>final<|message|>Weather bot; six cities looked up so far.<|return|>")
    asks_summary = vocab.encode_harmony(f"{INSTRUCTION}<|end|><|start|>assistant")
    written: list[list[int]] = []

    def author(request: Any) -> list[int]:
        prompt = request.prompt_token_ids
        written.append(summary if prompt[-len(asks_summary):] == asks_summary else next(script))
        return written[-1]

    engine = Recording(PlaybackEngine("scripted", author))
    server = serve(engine=engine, reasoning_key=KEY)
    client = client_for(server)
    conversation: list[dict[str, Any]] = []
    for turn in range(turns):
        conversation.append({"role": "user", "content": f"Weather in {CITIES[turn]}?"})
        # The client asks for compaction once, as a threshold crossed would (context_management).
        compacting = {"context_management": [{"type": "compaction", "compact_threshold": 1}]} \
            if turn == compact_at else {}
        while True:
            response = client.responses.create(model=MODEL, instructions="You are a weather bot.", tools=[WEATHER],
                                               input=conversation, store=False, include=INCLUDE,
                                               extra_body=compacting)
            compacting = {}
            output = [item.model_dump(exclude_none=True) for item in response.output]
            assert all(item["encrypted_content"] for item in output if item["type"] == "reasoning")
            conversation += output
            calls = [item for item in output if item["type"] == "function_call"]
            if not calls:
                assert response.output_text == f"It is {turn + 10}C in {CITIES[turn]}."
                break
            conversation += [{"type": "function_call_output", "call_id": call["call_id"], "output": f"{turn + 10}C"}
                             for call in calls]
    prompts = [request.prompt_token_ids for request in engine.requests]
    assert len(prompts) == 2 * turns + 1 and written.count(summary) == 1
    summarized = written.index(summary)
    broken = [step for step in range(1, len(prompts))
              if prompts[step][: len(expected := harmony_continuation(vocab, prompts[step - 1], written[step - 1]))]
              != expected]
    # The summary's own prompt continues the conversation; the answer after it starts from the compacted window.
    assert broken == [summarized + 1]
    after = vocab.decode(prompts[summarized + 1])
    assert "six cities looked up so far" in after and "12C" not in after  # turn 2's tool result is summarized
    # The analysis of the open tool loop is in the prompt as written; an ended turn's is not.
    last = vocab.decode(prompts[-1])
    assert f"Turn {turns - 1}: the user wants {CITIES[turns - 1]}; call the to" in last
    assert "Turn 0:" not in last
