"""Weights for the tiny gpt-oss that write well-formed Harmony: an analysis note, then a final answer that streams.

    python tests/vllm_harmony_weights.py MODEL_DIR SPEC_JSON    (vLLM's Python: it needs torch)

After the prompt's `<|start|>assistant` the model writes

    <|channel|>analysis<|message|>(Cyrillic words)<|end|><|start|>assistant<|channel|>final<|message|>(English words)

and never stops on its own (max_tokens ends it): the same `NOTE_WORDS` analysis words every time (so the answer
starts at the same token in every stream), then final words drawn at random for the rest. Every front end streams
that answer as it comes, which is what a latency benchmark needs; vLLM's dummy weights (noise, no header) make
vLLM's own front end hold all text to the end.

How: a bigram model (the layers' outputs are zero, as in tests/vllm_weights.py) plus one bit of context. Each token of
the machine above has an embedding class (a dimension set to 1 besides a constant dimension); `lm_head` maps each
class to the tokens that may follow it. `<|channel|>` and `<|message|>` are followed by different tokens the first and
second time, so the second layer's (full) attention sets a feature dimension once any analysis word is in the
context: one head whose query is a constant bias and whose key is non-zero only on analysis words, so it attends to
them alone when there are some (to nothing else: values are zero elsewhere); its value writes the feature. The
prompt holds no Cyrillic, so the feature is off until the model writes its note. Logits are exact (no noise): the
chosen tokens lead by 13 or more, the other 201k tokens by 39 or more; words within a set are equally likely.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOTE_WORDS = 8  # the analysis note: this many Cyrillic words, each its own class (a chain)
WORDS = 256  # the final answer's words
# RMSNorm leaves each of two unit dimensions at sqrt(128 / 2) = 8, each of three at sqrt(128 / 3).
PLAIN, WITH_FEATURE = math.sqrt(128 / 2), math.sqrt(128 / 3)


def harmony_spec() -> dict[str, Any]:
    """Embedding classes and `lm_head` rows (per class weights, feature weight) for the machine above."""
    import re

    from parsers.vocab import load_vocab

    vocab = load_vocab()
    special = vocab.special
    cyrillic = re.compile(rb" (?:[\xd0\xd1][\x80-\xbf]){4,}")
    english = re.compile(rb" [a-z]{4,9}")
    note = [t for t, piece in enumerate(vocab.token_bytes) if cyrillic.fullmatch(piece)][:NOTE_WORDS]
    final_words = [t for t, piece in enumerate(vocab.token_bytes) if english.fullmatch(piece)][:WORDS]
    [assistant], [analysis], [final] = vocab.encode("assistant"), vocab.encode("analysis"), vocab.encode("final")
    classes = {"assistant": [assistant], "channel": [special.channel], "analysis": [analysis], "final": [final],
               "message": [special.message], "end": [special.end], "start": [special.start],
               "final words": final_words, **{f"note {i}": [token] for i, token in enumerate(note)}}
    rows = [
        ([special.channel], {"assistant": 6}, 0),
        ([analysis], {"channel": 6}, -4),  # first header: 48 against final's 24; second: 13 against 39
        ([final], {"channel": 3}, 3),
        ([special.message], {"analysis": 6, "final": 6}, 0),
        ([note[0]], {"message": 6}, -4),  # the note's first word: 48 on the first <|message|>, 13 on the second
        *(([token], {f"note {i}": 10}, -4) for i, token in enumerate(note[1:])),  # each word the next: 39
        ([special.end], {f"note {len(note) - 1}": 6}, 0),
        (final_words, {"message": 3, "final words": 3}, 3),
        ([special.start], {"end": 6}, 0),
        ([assistant], {"start": 6}, 0),
    ]
    return {"classes": classes, "feature_classes": [f"note {i}" for i in range(len(note))],
            "rows": [{"tokens": tokens, "weights": weights, "feature": feature} for tokens, weights, feature in rows]}


def harmony_weights(python: Path | None = None) -> Callable[[Path, dict[str, Any]], None]:
    """A `weights` callback for tests.vllm_server.write_tiny_gpt_oss: this file run in vLLM's environment."""
    from tests.vllm_server import vllm_python

    def write_weights(directory: Path, config: dict[str, Any]) -> None:
        spec_file = directory / "harmony-spec.json"
        spec_file.write_text(json.dumps(harmony_spec()))
        subprocess.run([str(python or vllm_python()), __file__, str(directory), str(spec_file)], check=True,
                       capture_output=True, timeout=600)
        spec_file.unlink()

    return write_weights


def write(directory: Path, spec: dict[str, Any]) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(**json.loads((directory / "config.json").read_text()))
    torch.manual_seed(0)
    state = {name: tensor.detach().clone() for name, tensor in GptOssForCausalLM(config).state_dict().items()}
    for name, tensor in state.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones_like(tensor)
        elif ".self_attn." in name or ".down_proj" in name:
            state[name] = torch.zeros_like(tensor)  # the layers add nothing, but for the one head set below
    dims = {name: 1 + index for index, name in enumerate(spec["classes"])}  # dimension 0: a constant 1
    feature = 1 + len(dims)
    embed = torch.zeros(config.vocab_size, config.hidden_size)
    embed[:, 0] = 1.0
    for name, tokens in spec["classes"].items():
        embed[tokens, dims[name]] = 1.0
    head = torch.zeros(config.vocab_size, config.hidden_size)
    for row in spec["rows"]:
        for name, weight in row["weights"].items():
            head[row["tokens"], dims[name]] = weight
        head[row["tokens"], feature] = row["feature"]
    state["model.embed_tokens.weight"], state["lm_head.weight"] = embed, head
    # The last layer (full attention), head 0: attend to the feature class's tokens alone, write the feature.
    # Query and key use the last rotary pair's first dimension, whose rotation over 4k positions is ~1e-3 rad.
    layer = f"model.layers.{config.num_hidden_layers - 1}.self_attn."
    pair = config.head_dim // 2 - 1
    state[layer + "q_proj.bias"][pair] = 24.0  # score 24 * 8 / sqrt(64) (times YaRN's scale) on them, 0 elsewhere
    for name in spec["feature_classes"]:
        state[layer + "k_proj.weight"][pair, dims[name]] = 1.0  # key 8 on them
        state[layer + "v_proj.weight"][0, dims[name]] = 1 / PLAIN  # value 1
    state[layer + "o_proj.weight"][feature, 0] = 1.0
    path = directory / "model.safetensors"
    save_file({name: tensor.to(torch.bfloat16).contiguous() for name, tensor in state.items()}, str(path),
              metadata={"format": "pt"})
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())))
