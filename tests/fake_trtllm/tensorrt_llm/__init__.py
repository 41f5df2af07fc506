"""A faithful fake of the TensorRT-LLM API surface harmony-proxy uses, for machines without a GPU.

It mirrors two releases, chosen by FAKE_TRTLLM_SURFACE before the first import (`_surface.py`): `oldest`
(1.0, the first gpt-oss containers) and `newest` (1.2 to 1.3, the default). Both have `tensorrt_llm.LLM`,
`tensorrt_llm.SamplingParams`, `tensorrt_llm.sampling_params.GuidedDecodingParams`,
`tensorrt_llm.executor.RequestError` and `tensorrt_llm.llmapi.llm_args.TorchLlmArgs`, with the real names,
signatures and behaviours (see llmapi/llm.py). The "model" is a folder holding `script.jsonl`: Harmony
completions (`{"completion": "..."}`) the fake generates in turn, as token ids. The fake writes what it was
asked (`events.jsonl` in that folder) so tests in another process can check it.
"""

from tensorrt_llm._surface import SURFACE
from tensorrt_llm.executor.params.sampling import SamplingParams
from tensorrt_llm.llmapi.llm import LLM, RequestOutput

__version__ = f"{SURFACE.version} (fake)"
__all__ = ["LLM", "RequestOutput", "SamplingParams"]
