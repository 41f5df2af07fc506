from tensorrt_llm.llmapi.llm import LLM, CompletionOutput, RequestOutput
from tensorrt_llm.sampling_params import GuidedDecodingParams

__all__ = ["LLM", "CompletionOutput", "GuidedDecodingParams", "RequestOutput"]
