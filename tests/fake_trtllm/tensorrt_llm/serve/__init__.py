"""tensorrt_llm/serve: trtllm-serve's OpenAI server. The fake's serves nothing: harmony-proxy replaces it, and a
run that reached it would mean trtllm-serve's HTTP server was not swapped out."""

from typing import Any


class OpenAIServer:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("trtllm-serve's own OpenAIServer was started: harmony-proxy must replace it")
