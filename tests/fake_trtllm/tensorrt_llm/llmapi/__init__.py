from tensorrt_llm.executor.params.sampling import GuidedDecodingParams, SamplingParams
from tensorrt_llm.llmapi.llm import LLM, CompletionOutput, RequestOutput
from tensorrt_llm.llmapi.llm_args import CapacitySchedulerPolicy, DynamicBatchConfig, SchedulerConfig

__all__ = ["LLM", "CapacitySchedulerPolicy", "CompletionOutput", "DynamicBatchConfig", "GuidedDecodingParams",
           "RequestOutput", "SamplingParams", "SchedulerConfig"]
