"""Weights for the tiny gpt-oss whose output is noise with a bias: run by vLLM's Python (it needs torch).

    python tests/vllm_weights.py MODEL_DIR BIAS_JSON

BIAS_JSON maps token ids to logit offsets. Every token's embedding carries a constant 1 in its first dimension,
and the layers' outputs are zero (a bigram model: the last token alone decides), so the last hidden state always
points that way and `lm_head`'s first
column adds each token's offset to its logit, whatever the context; the other dimensions add noise (std ~1). With no
offsets the model is uniform noise over the 201,088 tokens, like vLLM's dummy weights; with offsets on structure
tokens (`<|end|>`, closing quotes, braces) it keeps writing noise but closes what it opens often enough for a
grammar-constrained completion to finish in a few dozen tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

NOISE = 0.01  # the embedding's other dimensions: after RMSNorm each is ~0.1, against ~11 for the first


def write(directory: Path, bias: dict[int, float], seed: int = 0) -> Path:
    config = GptOssConfig(**json.loads((directory / "config.json").read_text()))
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    hidden = config.hidden_size
    embed = torch.randn(config.vocab_size, hidden) * NOISE
    embed[:, 0] = 1.0
    state["model.embed_tokens.weight"] = embed
    head = torch.randn(config.vocab_size, hidden)
    scale = hidden**0.5  # the first dimension after RMSNorm: 1 / rms, rms ~ 1 / sqrt(hidden)
    head[:, 0] = 0.0
    for token, offset in bias.items():
        head[int(token), 0] = offset / scale
    state["lm_head.weight"] = head
    for name, tensor in state.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones_like(tensor)
        elif ".o_proj." in name or ".down_proj" in name:
            state[name] = torch.zeros_like(tensor)  # the layers add nothing: the last token alone decides
    path = directory / "model.safetensors"
    save_file({name: tensor.to(torch.bfloat16).contiguous() for name, tensor in state.items()}, str(path),
              metadata={"format": "pt"})
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())))
