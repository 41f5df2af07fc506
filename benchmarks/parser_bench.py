"""Per-token cost of our output parser against openai-harmony's StreamableParser.

    python benchmarks/parser_bench.py [--repeat N]

Both parsers are fed one token at a time, as a streaming server does. For StreamableParser we time what a
server must do per token to stream: `process(token)`, then read `last_content_delta`, `current_channel` and
`current_recipient` to route the delta (vLLM's loop); `process` alone is printed too, and with
`current_content`, which copies the whole message on every call.

Three views, because StreamableParser's cost depends on where a token falls (its first tokens cost ~20 us):
1. the recorded transcripts (fixtures/completions.json), parsers built outside the timed loop;
2. the same, per response, construction included (a server builds one parser per response);
3. long messages, to show the cost per token does not grow with the message.
Transcripts StreamableParser rejects (bare text, malformed headers) are left out of the comparison.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openai_harmony import Role, StreamableParser

from parsers.stream import OutputParser
from parsers.vocab import Vocab, load_vocab

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "completions.json"


def feed_ours(parser: OutputParser, tokens: list[int]) -> None:
    feed = parser.feed
    for token in tokens:
        feed((token,))
    parser.finish()


def feed_ours_by_4(parser: OutputParser, tokens: list[int]) -> None:
    for start in range(0, len(tokens), 4):
        parser.feed(tokens[start : start + 4])
    parser.finish()


def feed_harmony_streaming(parser: StreamableParser, tokens: list[int]) -> None:
    for token in tokens:
        parser.process(token)
        _ = parser.last_content_delta  # what a server reads after each token
        _ = parser.current_channel
        _ = parser.current_recipient


def feed_harmony_process(parser: StreamableParser, tokens: list[int]) -> None:
    for token in tokens:
        parser.process(token)


def feed_harmony_current_content(parser: StreamableParser, tokens: list[int]) -> None:
    for token in tokens:
        parser.process(token)
        _ = parser.current_content


CASES: list[tuple[str, str, Callable[[Any, list[int]], None]]] = [
    ("ours, 1 token per step", "ours", feed_ours),
    ("ours, 4 tokens per step", "ours", feed_ours_by_4),
    ("harmony, process + delta/channel/recipient", "harmony", feed_harmony_streaming),
    ("harmony, process only", "harmony", feed_harmony_process),
    ("harmony, process + current_content", "harmony", feed_harmony_current_content),
]


def new_parser(vocab: Vocab, kind: str) -> Any:
    return OutputParser(vocab) if kind == "ours" else StreamableParser(vocab.encoding, Role.ASSISTANT)


def per_token_us(vocab: Vocab, kind: str, feed: Callable, transcripts: list[list[int]], repeat: int,
                 with_construction: bool) -> float:
    total = sum(len(t) for t in transcripts)
    best = float("inf")
    for _ in range(repeat):
        if with_construction:
            start = time.perf_counter()
            for tokens in transcripts:
                feed(new_parser(vocab, kind), tokens)
        else:
            parsers = [new_parser(vocab, kind) for _ in transcripts]
            start = time.perf_counter()
            for parser, tokens in zip(parsers, transcripts):
                feed(parser, tokens)
        best = min(best, time.perf_counter() - start)
    return best / total * 1e6


def accepted_by_harmony(vocab: Vocab, tokens: list[int]) -> bool:
    try:
        feed_harmony_streaming(new_parser(vocab, "harmony"), tokens)
        return True
    except Exception:  # noqa: BLE001 (whatever openai-harmony raises)
        return False


def report(title: str, results: dict[str, float]) -> None:
    print(title)
    ours = results["ours, 1 token per step"]
    for name, cost in results.items():
        print(f"  {name:44s} {cost:7.3f} us/token  {cost / ours:5.1f}x ours")
    streaming = results["harmony, process + delta/channel/recipient"]
    print(f"  => StreamableParser streaming loop / ours: {streaming / ours:.1f}x\n")


def main() -> None:
    options = argparse.ArgumentParser(description="parser per-token benchmark")
    options.add_argument("--repeat", type=int, default=30)
    args = options.parse_args()
    vocab = load_vocab()
    transcripts = [vocab.encode_harmony(e["completion"]) for e in json.loads(FIXTURES.read_text())]
    accepted = [t for t in transcripts if accepted_by_harmony(vocab, t)]
    print(f"{len(transcripts)} recorded transcripts, {len(accepted)} accepted by StreamableParser "
          f"({len(transcripts) - len(accepted)} rejected: it raises on them); {sum(map(len, accepted))} tokens; "
          f"best of {args.repeat} runs\n")
    for title, construction in (("1. recorded transcripts, per-token loop only:", False),
                                ("2. recorded transcripts, per response (parser construction included):", True)):
        report(title, {name: per_token_us(vocab, kind, feed, accepted, args.repeat, construction)
                       for name, kind, feed in CASES})

    word, sentence = vocab.encode(" word"), vocab.encode(" The weather in Paris is sunny today, 18 degrees.")
    long_turn = (vocab.encode_harmony("<|channel|>analysis<|message|>") + sentence * 100
                 + vocab.encode_harmony("<|end|><|start|>assistant<|channel|>final<|message|>") + sentence * 100
                 + vocab.encode_harmony("<|return|>"))
    report(f"3. one long turn ({len(long_turn)} tokens: analysis then final), per-token loop only:",
           {name: per_token_us(vocab, kind, feed, [long_turn], max(5, args.repeat // 3), False)
            for name, kind, feed in CASES})

    print("4. per-token cost as one message grows (per-token loop only):")
    for length in (100, 1_000, 10_000):
        tokens = (vocab.encode_harmony("<|channel|>final<|message|>") + word * length
                  + vocab.encode_harmony("<|return|>"))
        ours = per_token_us(vocab, "ours", feed_ours, [tokens], 5, False)
        harmony = per_token_us(vocab, "harmony", feed_harmony_current_content, [tokens], 3, False)
        print(f"  {length:6d}-token message: ours {ours:6.3f} us/token   "
              f"harmony + current_content {harmony:7.3f} us/token")


if __name__ == "__main__":
    main()
