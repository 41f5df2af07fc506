"""tensorrt_llm/grpc/openengine/server.py: the OpenEngine gRPC launcher that 2026 main's `serve()` imports inside
itself for `--grpc` (issue 33's reading; its tests, e.g. id 70591717931, call `openengine_server.launch_server`).
It builds the LLM, then serves gRPC: the fake has no gRPC server, so reaching it fails after the LLM is built, as a
start-up that went too far would."""

from typing import Any


def launch_server(host: str, port: int, llm_args: dict[str, Any], served_model_name: str | None = None) -> None:
    from tensorrt_llm.llmapi import LLM

    LLM(**llm_args)
    raise AssertionError("a gRPC server was started: harmony-proxy must refuse --grpc before this")
