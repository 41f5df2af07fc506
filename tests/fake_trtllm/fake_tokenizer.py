"""The fake TensorRT-LLM's tokenizer: the real o200k_harmony vocabulary, loaded once per process (outside the
`tensorrt_llm` package, which tests re-import for each release surface)."""

import functools
from typing import Any


@functools.cache
def harmony_vocab() -> Any:
    from parsers.vocab import load_vocab

    return load_vocab()
