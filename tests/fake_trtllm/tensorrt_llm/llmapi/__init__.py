from tensorrt_llm.llmapi.llm import LLM, CompletionOutput, RequestOutput

__all__ = ["LLM", "CompletionOutput", "RequestOutput"]
