"""Write a Hugging Face tokenizer directory for gpt-oss (o200k_harmony) from the bundled vocabulary.

    python benchmarks/hf_tokenizer.py OUTDIR

Benchmark clients such as NVIDIA aiperf count tokens with a Hugging Face tokenizer, which they download from
the Hub; air-gapped machines cannot. This builds the same tokenizer with no network: the o200k_base BPE ranks
shipped in `parsers/data` (hash-checked by `parsers.vocab.load_vocab`) become a byte-level BPE model, and the
1,091 Harmony special tokens (<|start|>, <|channel|>, ... from id 199998 up) become added tokens. Before
writing, it checks that the result encodes sample text to exactly the ids `Vocab.encode` gives.

Needs `tokenizers` (which aiperf already installs) and `openai-harmony` (for `parsers.vocab`); no transformers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone, not an installed package

from parsers.vocab import O200K_PATTERN, Vocab, load_vocab

MODEL_MAX_LENGTH = 131072

# Text the check encodes both ways: prose, code, numbers, whitespace runs, contractions, non-Latin scripts,
# emoji (multi-byte pieces), and Harmony special-token spellings.
SAMPLES = [
    "Hello, world! It's 2025 and we're testing o200k_harmony.",
    "def f(x):\n    return x ** 2  # square\n\n\n\tindented\r\nwindows line\n",
    "The price is $1,234,567.89 (about 12345678901234 cents).",
    "I'LL SAY IT'S FINE, they'd've said. Don't. WON'T.",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Ελληνικά, русский текст, العربية, हिन्दी",
    "emoji 🤖👍🏽 and combining e\u0301 and zero\u200bwidth",
    "   leading spaces and trailing   \n\n  ",
    "<|start|>user<|message|>Hi<|end|> spelled as text",
    '{"key": [1, 2, 3], "url": "https://example.com/a/b?c=d&e=f"}',
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate:",
]


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer applies before BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table = {byte: chr(byte) for byte in printable}
    shift = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shift)
            shift += 1
    return table


def bpe_from_ranks(token_bytes: list[bytes]) -> models.BPE:
    """A BPE model whose merges reproduce tiktoken's: the lowest-ranked merged token is merged first.

    Each token of two or more bytes gets a merge for every way of splitting it into two tokens, ordered by the
    merged token's rank (then the pieces'), which is the order tiktoken's rank-driven merging follows.
    `ignore_merges` takes a pre-token that is itself a token whole, as tiktoken does.
    """
    alphabet = byte_level_alphabet()
    ranks = {piece: rank for rank, piece in enumerate(token_bytes)}

    def spell(piece: bytes) -> str:
        return "".join(alphabet[byte] for byte in piece)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for rank, piece in enumerate(token_bytes):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    vocab = {spell(piece): rank for rank, piece in enumerate(token_bytes)}
    return models.BPE(
        vocab, [(spell(left), spell(right)) for *_, left, right in merges], fuse_unk=False, ignore_merges=True
    )


def build_tokenizer(vocab: Vocab) -> Tokenizer:
    tokenizer = Tokenizer(bpe_from_ranks(vocab.token_bytes))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # Added in id order, so each lands on its own id (the ids right after the text ranks).
    for spelling, token in sorted(vocab.special_ids.items(), key=lambda item: item[1]):
        tokenizer.add_special_tokens([AddedToken(spelling, special=True, normalized=False)])
        if tokenizer.token_to_id(spelling) != token:
            raise SystemExit(f"special token {spelling} got id {tokenizer.token_to_id(spelling)}, expected {token}")
    return tokenizer


def check(tokenizer: Tokenizer, vocab: Vocab) -> int:
    """Compare with `Vocab.encode` / `encode_harmony`; return how many tokens were compared."""
    compared = 0
    for text in SAMPLES:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        # Our tokenizer turns special spellings into special tokens, as HF clients expect; so does encode_harmony.
        expected = vocab.encode_harmony(text)
        if ours != expected:
            raise SystemExit(f"tokenizer mismatch on {text!r}:\n  hf:     {ours}\n  harmony: {expected}")
        if tokenizer.decode(ours, skip_special_tokens=False) != text:
            raise SystemExit(f"decode does not round-trip {text!r}")
        compared += len(ours)
    # Plain text without special spellings must match `Vocab.encode` exactly; run it over a long mixed text too.
    long_text = "\n".join(sample for sample in SAMPLES if "<|" not in sample) * 50
    if tokenizer.encode(long_text, add_special_tokens=False).ids != vocab.encode(long_text):
        raise SystemExit("tokenizer mismatch on the long sample")
    return compared + len(vocab.encode(long_text))


def write(tokenizer: Tokenizer, outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(outdir / "tokenizer.json"))
    # gpt-oss's own special-token roles; generation stops on <|return|> (and <|call|>).
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        **special,
    }
    (outdir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (outdir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path, help="directory to write tokenizer.json and its configs into")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    vocab = load_vocab()
    tokenizer = build_tokenizer(vocab)
    compared = check(tokenizer, vocab)
    write(tokenizer, args.outdir)
    print(
        f"wrote {args.outdir}/tokenizer.json ({tokenizer.get_vocab_size()} tokens); "
        f"{compared} tokens of sample text match parsers.vocab; {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
