"""tensorrt_llm/_torch/pyexecutor/grammar_matcher.py: which guides each backend takes, and in which form.

The guided decoder builds one matcher per guided request when the request is scheduled; what the real
factories raise here fails that request. No token mask is applied (the fake's "model" is a script), but with
llguidance the script is fed to a real matcher, wrapped as TensorRT-LLM wraps it (EOS only once the matcher
has stopped), so tests see whether a masked model could have written it.

- Guide type, as `SamplingParams._get_guided_decoding_params` picks it: json_object, json, regex, grammar,
  structural_tag. The C++ binding takes the guide as a string.
- xgrammar takes every type. A structural tag is, before PR #7893 (the oldest surface), `json.loads`-ed and read
  as `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`; after it, the JSON string goes to
  `xgrammar.GrammarCompiler.compile_structural_tag`, which parses `{"type": "structural_tag", "format": {...}}`.
- llguidance takes json_object, json, regex and grammar, the grammar in Lark (`grammar_from_lark`); a structural
  tag is "Unsupported guide type".
"""

from __future__ import annotations

import json
from typing import Any

from tensorrt_llm._surface import SURFACE
from tensorrt_llm.executor.params.sampling import GuidedDecodingParams


def guide_of(params: GuidedDecodingParams) -> tuple[str, Any]:
    if params.json_object:
        return "JSON", None
    for name, guide_type in (("json", "JSON_SCHEMA"), ("regex", "REGEX"), ("grammar", "EBNF_GRAMMAR"),
                             ("structural_tag", "STRUCTURAL_TAG")):
        guide = getattr(params, name)
        if guide is not None:
            if name == "json" and isinstance(guide, dict):
                guide = json.dumps(guide)
            if not isinstance(guide, str):
                raise TypeError(f"__init__(): incompatible function arguments: guide must be str, got {type(guide)}")
            return guide_type, guide
    return "NONE", None


class XGrammarMatcherFactory:
    def __init__(self, vocab: Any) -> None:
        pass  # the real one builds xgrammar.TokenizerInfo from the tokenizer's vocabulary

    def create(self, params: GuidedDecodingParams) -> LLGuidanceMatcher | None:
        guide_type, guide = guide_of(params)
        if guide_type == "STRUCTURAL_TAG":
            tag = json.loads(guide)
            if SURFACE.structural_tag_form == "legacy":  # the new form fails with KeyError, as in the real code
                wanted = [("structures", tag)] + [(key, s) for s in tag.get("structures", ()) for key in
                                                  ("begin", "schema", "end")] + [("triggers", tag)]
                missing = next((key for key, holder in wanted if key not in holder), None)
                if missing:
                    raise KeyError(missing)
            elif tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), dict):
                raise ValueError(f"Invalid structural tag: expected {{'type': 'structural_tag', 'format': ...}}, "
                                 f"got keys {sorted(tag)}")
        return None  # xgrammar is not installed here: the form is checked, nothing is matched


class LLGuidanceMatcherFactory:
    def __init__(self, vocab: Any) -> None:
        from llguidance import LLMatcher  # as the real module, which imports llguidance at the top

        self._matcher_class, self._vocab, self._tokenizer = LLMatcher, vocab, None

    def create(self, params: GuidedDecodingParams) -> LLGuidanceMatcher | None:
        guide_type, guide = guide_of(params)
        if guide_type == "NONE":  # no guide set: the request is not guided
            return None
        grammars = {"JSON": lambda: self._matcher_class.grammar_from_json_schema('{"type": "object"}'),
                    "JSON_SCHEMA": lambda: self._matcher_class.grammar_from_json_schema(guide),
                    "REGEX": lambda: self._matcher_class.grammar_from_regex(guide),
                    "EBNF_GRAMMAR": lambda: self._matcher_class.grammar_from_lark(guide)}  # Lark, not EBNF
        if guide_type not in grammars:
            raise ValueError(f"Unsupported guide type: GuideType.{guide_type}.")
        if self._tokenizer is None:  # the real factory builds it with the LLM; here on first use, to save tests time
            # the o200k_harmony tokenizer, EOS <|return|> (as gpt-oss's)
            from proxy.engines.matcher import build_tokenizer

            self._tokenizer = build_tokenizer(self._vocab)
        matcher = self._matcher_class(self._tokenizer, grammars[guide_type]())
        if matcher.is_error():
            raise ValueError(f"LLGuidance matcher error: {matcher.get_error()}")
        return LLGuidanceMatcher(matcher, self._tokenizer.eos_token)


class LLGuidanceMatcher:
    def __init__(self, matcher: Any, eos_token: int) -> None:
        self._matcher, self._eos_token = matcher, eos_token

    def accept_token(self, token_id: int) -> bool:
        if self._matcher.is_stopped():  # EOS only once the grammar is done
            return token_id == self._eos_token
        return self._matcher.try_consume_tokens([token_id]) > 0 and not self._matcher.is_error()


FACTORIES = {"xgrammar": XGrammarMatcherFactory, "llguidance": LLGuidanceMatcherFactory}
