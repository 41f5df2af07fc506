"""tensorrt_llm/sampling_params.py: the classes' old home. In 2026 they live in executor/params/sampling.py and
this path warns that it is going away (`tensorrt_llm.llmapi` is the stable one)."""

import warnings

from tensorrt_llm._surface import SURFACE
from tensorrt_llm.executor.params.sampling import GuidedDecodingParams, SamplingParams

if SURFACE.sampling_params_moved:
    warnings.warn("tensorrt_llm.sampling_params is deprecated and will be removed; import SamplingParams and "
                  "GuidedDecodingParams from tensorrt_llm.llmapi", DeprecationWarning, stacklevel=2)

__all__ = ["GuidedDecodingParams", "SamplingParams"]
