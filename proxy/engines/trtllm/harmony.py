"""What harmony-proxy adds to trtllm-serve's requests: Harmony's stop tokens, token ids in and out, guided decoding.

Sampling is converted as the installed trtllm-serve converts it: a request model of its own protocol
(`tensorrt_llm/serve/openai_protocol.py`, `CompletionRequest`, in every release from the gpt-oss-dev container to
2026 main) built from the fields the client set, then its `to_sampling_params()`. So the defaults (temperature and
top_p 1.0, top_k 0, seed, `ignore_eos`, `min_tokens`) are that release's. What Harmony needs is then given through
the same model where the release defines the field, else set on the SamplingParams it returned:
- `stop_token_ids`: Harmony's `<|return|>`, `<|call|>` (none with `ignore_eos`);
- `include_stop_str_in_output`: kept, so that the parser sees `<|call|>` (trtllm-serve's Harmony path strips it);
- `detokenize: false`: the parser reads token ids, text would be wasted work;
- `guided_decoding`: the request's grammar, in the form the LLM's backend takes (`guided_decoding` below).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from proxy.engines.base import ContextWindow, GenerationRequest

logger = logging.getLogger("harmony_proxy.engine")

GPT_OSS_CONTEXT = 131072  # gpt-oss's max_position_embeddings: assumed only where the engine says nothing
# `to_sampling_params` reads no prompt (every release read): a placeholder spares validating 100k ids per request
_PLACEHOLDER_PROMPT = [0]
_CONSTRAINTS = "Output constraints (tool_choice required or named, strict tools, response_format, text.format)"


def sampling_params(protocol: Any, request: GenerationRequest, model: str, guide: Any) -> Any:
    """The request's SamplingParams: the release's own conversion (`protocol` is its openai_protocol module)."""
    fields = request.sampling.request_fields()
    fields.update(detokenize=False, include_stop_str_in_output=True)
    request_model = protocol.CompletionRequest
    defined = {name: value for name, value in fields.items() if name in request_model.model_fields}
    params = request_model(model=model, prompt=_PLACEHOLDER_PROMPT, **defined).to_sampling_params()
    for name, value in fields.items():
        if name not in defined:  # a field this release's protocol lacks: set where trtllm-serve's LLM reads it
            setattr(params, name, value)
    params.guided_decoding = guide
    return params


def context_window(llm: Any) -> tuple[ContextWindow, str]:
    """The prompt plus output and the longest prompt the built LLM takes, and where the former was read.

    - `llm.args.max_seq_len` where the arguments set it. The PyTorch backend leaves it None otherwise
      (`_TorchLLM._build_model` never writes back what its executor deduces, llm.py id 55216765702);
    - else the model's `max_position_embeddings` (`llm._hf_model_config`, loaded by `_build_model`), from which the
      PyTorch executor deduces its max_seq_len;
    - else gpt-oss's 131072, assumed (and logged as such).
    Without chunked prefill TensorRT-LLM refuses a prompt longer than `max_num_tokens` (llm.py `_check_arguments`).
    """
    args = llm.args
    total, source = getattr(args, "max_seq_len", None), "max_seq_len"
    if not total:
        total = getattr(getattr(llm, "_hf_model_config", None), "max_position_embeddings", None)
        source = "the model's max_position_embeddings (max_seq_len unset)"
    if not total:
        total, source = GPT_OSS_CONTEXT, "ASSUMED: gpt-oss's 131072 (the engine tells no max_seq_len or model config)"
    total = int(total)
    if getattr(args, "enable_chunked_prefill", False):
        return ContextWindow(total, total), source
    return ContextWindow(total, min(total, int(getattr(args, "max_num_tokens", None) or total))), source


@dataclass(frozen=True)
class GuidedDecoding:
    """How output constraints reach TensorRT-LLM, decided once the LLM arguments are known.

    `field` is the GuidedDecodingParams field a constrained request fills: `grammar` (llguidance: the Lark
    grammar of the whole completion) or `structural_tag` (xgrammar: the same language as a JSON structural
    tag); None when nothing is enforced, `reason` then saying why.
    """

    field: str | None
    how: str = ""
    reason: str = ""

    @property
    def message(self) -> str:
        if self.field:
            return f"{_CONSTRAINTS} are enforced by TensorRT-LLM's {self.how}; analysis stays free"
        return f"{_CONSTRAINTS} are NOT enforced, only described to the model in the prompt: {self.reason}"

    def params(self, guided_params: Any, request: GenerationRequest) -> Any:
        """The request's GuidedDecodingParams, or None: unconstrained, or not enforceable here (then logged)."""
        grammar = request.constraint.grammar
        if grammar is None:
            return None
        if self.field == "grammar":
            return guided_params(grammar=grammar.lark)
        if self.field == "structural_tag":
            if grammar.structural_tag_gaps:
                logger.warning("request %s: %s NOT enforced (xgrammar structural tags have no Lark form; the "
                               "llguidance backend enforces it)", request.request_id, grammar.structural_tag_gaps)
            return guided_params(structural_tag=json.dumps(grammar.structural_tag, separators=(",", ":")))
        logger.warning("request %s: %s, NOT enforced: %s", request.request_id, grammar.summary, self.reason)
        return None


def guided_decoding(backend: str | None, xgrammar_version: str | None, speculative: bool = False,
                    tensorrt_llm_version: str = "") -> GuidedDecoding:
    """The form each backend accepts (tensorrt_llm/_torch/pyexecutor/grammar_matcher.py).

    - llguidance takes `grammar` as Lark (`LLMatcher.grammar_from_lark`) in every release.
    - xgrammar takes `structural_tag` as a JSON string; since PR #7893 (xgrammar 0.1.25, 1.1 GA and 1.2 on) in
      the `{"type": "structural_tag", "format": ...}` form. Before it only the legacy structures/triggers form,
      which can require neither a call nor a JSON answer: nothing is sent then. Where xgrammar's version cannot
      be read, TensorRT-LLM's tells: 1.2.0rc0 and later surely have the new form.
    """
    if backend == "llguidance":
        return GuidedDecoding("grammar", "llguidance backend (a Lark grammar of the whole completion)")
    if backend == "xgrammar":
        if (_version(xgrammar_version) >= (0, 1, 25) if xgrammar_version
                else _version(tensorrt_llm_version) >= (1, 2)):
            return GuidedDecoding("structural_tag", "xgrammar backend (a structural tag of the whole completion)")
        return GuidedDecoding(None, reason=(
            f"xgrammar {xgrammar_version} takes structural tags only in the legacy structures/triggers form, which "
            "can require neither a call nor a JSON answer; use guided_decoding_backend: llguidance"))
    if speculative:
        return GuidedDecoding(None, reason="no guided_decoding_backend (with speculative_config; set "
                                           "guided_decoding_backend: llguidance where your release allows both)")
    return GuidedDecoding(None, reason=("no guided_decoding_backend in the LLM arguments (trtllm-serve sets none; "
                                        "set it in the YAML, or pass --guided-decoding-backend llguidance)"))


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])
