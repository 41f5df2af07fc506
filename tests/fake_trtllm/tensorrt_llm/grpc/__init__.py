"""tensorrt_llm/grpc: trtllm-serve's gRPC servers (2026)."""
