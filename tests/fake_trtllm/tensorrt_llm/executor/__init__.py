class RequestError(RuntimeError):
    """tensorrt_llm/executor/utils.py: a request the executor could not serve."""
