from tensorrt_llm.executor.params.sampling import GuidedDecodingParams, SamplingParams
from tensorrt_llm.llmapi.llm import LLM, CompletionOutput, RequestOutput
from tensorrt_llm.llmapi.llm_args import (
    BuildConfig,
    CapacitySchedulerPolicy,
    DynamicBatchConfig,
    KvCacheConfig,
    SchedulerConfig,
)

__all__ = ["LLM", "BuildConfig", "CapacitySchedulerPolicy", "CompletionOutput", "DynamicBatchConfig",
           "GuidedDecodingParams", "KvCacheConfig", "RequestOutput", "SamplingParams", "SchedulerConfig"]
