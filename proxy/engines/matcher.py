"""llguidance matchers for output grammars: one tokenizer per vocabulary, each distinct grammar compiled once.

llguidance needs a tokenizer of its own (about 1 s to build from the o200k ranks and the Harmony special
tokens), so it is built once, lazily, by whoever first needs it (off the event loop: see `matcher_off_loop`).
A grammar compiles in 5 to 50 ms; the compiled matcher is kept by the grammar's key and each request gets a
copy (`deep_copy`, far cheaper than compiling), so agent loops that resend the same tools compile once.

A client's grammar (a JSON Schema, a Lark or regex tool format) is compiled under llguidance's own limits
(`LIMITS`): its first mask, where the lexer is built, is computed with the compile, in the worker thread, and a
grammar past the limits is a GrammarError (a 400) rather than seconds of work: `pattern: "^a{200000}$"` took
0.3 to 29 s to build with llguidance's defaults, 0.3 s under these; an enum of 20,000 values is refused.

The tokenizer's EOS is `<|return|>`: llguidance allows EOS exactly where the grammar is complete, which is how
a final answer ends (see `tools.grammar`). `<|call|>` stays an ordinary token the grammar names.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import llguidance
import llguidance.tiktoken
import tiktoken

from parsers.vocab import O200K_PATTERN, Vocab
from tools.bounded_cache import BoundedCache, CacheStats
from tools.grammar import OutputGrammar
from tools.schema_check import LLGUIDANCE_LIMITS

logger = logging.getLogger("harmony_proxy.grammar")

LIMITS = LLGUIDANCE_LIMITS  # the same limits the request check used (tools/schema_check.py)


class GrammarError(ValueError):
    """llguidance refused a grammar; the message is its own."""


class GrammarMatchers:
    """The llguidance tokenizer of one vocabulary, and compiled grammars by key (bounded, least recent first)."""

    def __init__(self, vocab: Vocab, max_grammars: int = 256, tokenizer: llguidance.LLTokenizer | None = None) -> None:
        """`tokenizer`: one already built for this vocabulary (else built on first use)."""
        self.vocab = vocab
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._compiled: BoundedCache[str, llguidance.LLMatcher] = BoundedCache(max_grammars, max_grammars)

    def tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (about 1 s); safe to call from several threads."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = build_tokenizer(self.vocab)
            return self._tokenizer

    def matcher(self, grammar: OutputGrammar) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the completion; raises GrammarError if the grammar does not compile."""
        compiled = self._compiled.get(grammar.key)
        return (compiled or self._compile(grammar)).deep_copy()

    async def matcher_off_loop(self, grammar: OutputGrammar) -> llguidance.LLMatcher:
        """`matcher`, in a worker thread unless it is only a copy of a cached grammar."""
        compiled = self._compiled.get(grammar.key)
        if compiled is not None:
            return compiled.deep_copy()
        return (await asyncio.to_thread(self._compile, grammar)).deep_copy()

    def _compile(self, grammar: OutputGrammar) -> llguidance.LLMatcher:
        compiled = llguidance.LLMatcher(self.tokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar.lark),
                                        log_level=0, limits=llguidance.LLParserLimits(**LIMITS))
        if not compiled.is_error():
            compiled.compute_bitmask()  # builds the lexer: the compile's cost, bounded by LIMITS
        if compiled.is_error():
            raise GrammarError(compiled.get_error())
        warnings = compiled.get_grammar_warnings()
        if warnings:
            logger.debug("grammar %s (%s) relaxed: %s", grammar.key[:12], grammar.summary, "; ".join(warnings))
        self._compiled.put(grammar.key, compiled, 1)
        return compiled

    def stats(self) -> CacheStats:
        return self._compiled.stats()


def build_tokenizer(vocab: Vocab) -> llguidance.LLTokenizer:
    ranks = {piece: rank for rank, piece in enumerate(vocab.token_bytes)}
    encoding = tiktoken.Encoding(
        "o200k_harmony", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens=dict(vocab.special_ids)
    )
    return llguidance.tiktoken.lltokenizer_from_encoding(
        encoding, n_vocab=vocab.vocab_size, eos_token=vocab.special.return_
    )

