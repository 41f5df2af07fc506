"""A fake of the TensorRT-LLM that harmony-proxy runs, for machines without a GPU: a fake trtllm-serve.

It mirrors one release per surface, chosen by FAKE_TRTLLM_SURFACE before the first import (`_surface.py`):
`tensorrt_llm.commands.serve` (trtllm-serve's click command, its defaults, precedence and YAML merge), strict
pydantic LLM argument classes (`llmapi/llm_args.py`), `tensorrt_llm.LLM`, `SamplingParams`, the OpenAI protocol's
`CompletionRequest.to_sampling_params`, with the real names and behaviours (see llmapi/llm.py). The "model" is a
folder holding `script.jsonl`: Harmony completions (`{"completion": "..."}`) the fake generates in turn, as token
ids. The fake writes what it was asked (`events.jsonl` in that folder) so tests in another process can check it.
"""

from tensorrt_llm._surface import SURFACE
from tensorrt_llm.executor.params.sampling import SamplingParams
from tensorrt_llm.llmapi.llm import LLM, RequestOutput

__version__ = f"{SURFACE.version} (fake)"
__all__ = ["LLM", "RequestOutput", "SamplingParams"]
