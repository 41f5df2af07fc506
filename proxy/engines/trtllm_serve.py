"""Run the installed trtllm-serve's own start-up code, and take the LLM it builds instead of its HTTP server.

The seam. In every version read (`tensorrt_llm/commands/serve.py`: early 2025, before 1.0, ids 50627517773 and
6225645832; late 2025, the 1.1/1.2 line, @4c05a748; 2026, 1.3.0rc, ids 4219957788 and 59682888564), the click
command `serve` parses the command line, builds the LLM arguments (`get_llm_args`), applies the YAML
(`update_llm_args_with_extra_dict`, with its precedence and merges), and calls the module-level
`launch_server(host, port, llm_args, ...)`. That function builds the LLM for the backend the arguments name
(`PyTorchLLM(**llm_args)`, AutoDeploy, or the TensorRT engine) and hands it to the module-level
`OpenAIServer(llm=...)` (`generator=...` in the latest), which it runs with `asyncio.run(server(host, port, ...))`.
Both names are looked up in the module when called, in every one. So:

- `serve.main(argv, standalone_mode=False)` runs the release's own parsing: every flag, default, YAML key,
  precedence rule and error is that release's (a click usage error is reported as trtllm-serve reports it);
- `launch_server` is wrapped: its own signature binds the call, so the arguments are read by name whatever the
  release passes (tool_parser, served_model_name, the disaggregated roles...), then the real one runs;
- `OpenAIServer` is replaced (in that module, and in `tensorrt_llm.serve`, should a release import it inside
  `launch_server`) by a stand-in that keeps the LLM and serves nothing: the real `launch_server` returns once the
  LLM is built (2026 releases bind a socket first: they are given a free loopback port).

What newer releases add around it, and how it is handled:
- disaggregated roles (`--server_role`, `--metadata_server_config_file`, `--disagg_cluster_uri`, a YAML
  `disagg_cluster`) reach `launch_server` as arguments: refused, with the reason;
- `--grpc` (2026) and the other servers (`launch_grpc_server`, visual generation, multimodal encoders) are other
  `launch_*` functions: each is replaced by one that refuses, so nothing is built or served;
- `num_serve_frontends` (1.4): several HTTP front ends on one engine, which is what harmony-proxy's `--workers`
  does; a value above 1 in the LLM arguments is refused with that advice.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("harmony_proxy.engine")

_ROLES = ("server_role", "metadata_server_cfg", "disagg_cluster_config")
_DISAGGREGATED = ("disaggregated serving is not run in process: put harmony-proxy --engine upstream in front of "
                  "trtllm-serve's disaggregated deployment")


class TrtllmServeError(Exception):
    """trtllm-serve refused the command line or its YAML, or asked for what harmony-proxy does not serve."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class ServeCall:
    """What trtllm-serve's `serve` handed to `launch_server`.

    `llm_args` is the very dict the LLM is then built from (its flags, defaults and YAML, as that release merges
    them); `served_model_name` the name its OpenAI server would answer to; `arguments` every argument by name.
    """

    llm_args: dict[str, Any]
    served_model_name: str
    tool_parser: str | None
    arguments: dict[str, Any]


class _ParsedOnly(Exception):
    """Raised from `on_call` to stop trtllm-serve before it builds anything."""


def run_trtllm_serve(argv: list[str], on_call: Callable[[ServeCall], None] = lambda call: None) -> Any:
    """Run `trtllm-serve serve ARGV` as installed; return the LLM it built.

    `on_call` sees the `launch_server` call before the LLM is built (it may adjust `llm_args`, or raise).
    """
    import tensorrt_llm.serve as servers
    from tensorrt_llm.commands import serve as module

    built: list[Any] = []
    real_launch = module.launch_server
    signature = inspect.signature(real_launch)

    def launch_server(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        named = dict(bound.arguments)
        for role in _ROLES:
            if named.get(role) is not None:
                raise TrtllmServeError(f"{role}: {_DISAGGREGATED}")
        llm_args = named["llm_args"]
        if int(llm_args.get("num_serve_frontends") or 1) > 1:
            raise TrtllmServeError("num_serve_frontends > 1: harmony-proxy runs one engine; its --workers "
                                   "(alias --num_serve_frontends) sets the HTTP processes that share it")
        served = named.get("served_model_name") or llm_args["model"]
        on_call(ServeCall(llm_args, str(served), named.get("tool_parser"), named))
        real_launch(*bound.args, **bound.kwargs)

    class ServerReplaced:
        """Stands in for trtllm-serve's OpenAIServer: keeps the LLM, serves nothing."""

        app = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs.get("llm", kwargs.get("generator", args[0] if args else None)))

        async def __call__(self, *args: Any, **kwargs: Any) -> None:
            return None

    replaced: dict[str, Any] = {"launch_server": launch_server, "OpenAIServer": ServerReplaced}
    for name in dir(module):
        if name.startswith("launch_") and name != "launch_server" and callable(getattr(module, name)):
            replaced[name] = _refusing(name)
    # also where the server package exports it, should a release import it inside launch_server
    with _replaced(module, replaced), _replaced(servers, {"OpenAIServer": ServerReplaced}):
        _run_click(module.serve, [*argv, *_loopback_port()])
    if not built:
        raise TrtllmServeError("trtllm-serve built no LLM (nothing to serve)")
    return built[0]


def parse_trtllm_serve(argv: list[str]) -> ServeCall:
    """What trtllm-serve would build from ARGV, without building it (errors are its own)."""
    calls: list[ServeCall] = []

    def stop(call: ServeCall) -> None:
        calls.append(ServeCall(dict(call.llm_args), call.served_model_name, call.tool_parser, call.arguments))
        raise _ParsedOnly

    try:
        run_trtllm_serve(argv, stop)
    except _ParsedOnly:
        return calls[0]
    raise TrtllmServeError("trtllm-serve did not reach launch_server")


def _run_click(command: Any, argv: list[str]) -> None:
    import click

    try:
        command.main(args=argv, prog_name="trtllm-serve", standalone_mode=False)
    except click.ClickException as exc:
        raise TrtllmServeError(f"trtllm-serve: {exc.format_message()}", exc.exit_code) from None
    except click.exceptions.Exit as exc:  # --help: printed by click, nothing to serve
        raise TrtllmServeError("trtllm-serve exited without serving", exc.exit_code) from None
    except (ValueError, TypeError, AssertionError, OSError) as exc:  # its YAML and argument checks
        raise TrtllmServeError(f"trtllm-serve: {type(exc).__name__}: {exc}") from None


def _refusing(name: str) -> Callable[..., None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise TrtllmServeError(f"trtllm-serve chose {name} (gRPC, or a model that is not a language model): "
                               "harmony-proxy serves language models over its own HTTP server only")

    return refuse


def _loopback_port() -> list[str]:
    """A free loopback port for trtllm-serve's own bind (2026 releases bind before building the LLM)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return ["--host", "127.0.0.1", "--port", str(probe.getsockname()[1])]


@contextlib.contextmanager
def _replaced(module: Any, names: dict[str, Any]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in names}
    try:
        for name, value in names.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
