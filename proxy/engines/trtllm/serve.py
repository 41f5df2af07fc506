"""Run the installed trtllm-serve's own start-up code, and take the LLM it builds instead of its HTTP server.

The seam. In every version read (`tensorrt_llm/commands/serve.py`: early 2025, before 1.0, ids 50627517773 and
6225645832; late 2025, the 1.1/1.2 line, @4c05a748; 2026, 1.3.0rc, ids 4219957788 and 59682888564), the click
command `serve` parses the command line, builds the LLM arguments (`get_llm_args`), applies the YAML
(`update_llm_args_with_extra_dict`, with its precedence and merges), and calls the module-level
`launch_server(host, port, llm_args, ...)`. That function builds the LLM for the backend the arguments name and
hands it to the module-level `OpenAIServer(llm=...)` (`generator=...` from 2026). Both names are looked up in the
module when called, in every one. So:

- the command line is parsed by the release's own click command first (`make_context`): every flag, default and
  usage error is that release's, and what harmony-proxy cannot serve is refused from the parsed values, before
  anything loads: `--grpc` (2026: its launchers are imported inside `serve()`), `--middleware` (ASGI middlewares
  for trtllm-serve's FastAPI app, which harmony-proxy replaces), a diffusion model (the release's own
  `get_is_diffusion_model`);
- `launch_server` is wrapped: its own signature binds the call, so the arguments are read by name whatever the
  release passes; disaggregated roles are refused there, still before the build;
- `OpenAIServer` is replaced (in that module, and in `tensorrt_llm.serve`) by a stand-in that takes the LLM it is
  given (`llm=`, `generator=`, or open PR #17787's `generator_factory=`, which it calls) and stops trtllm-serve
  there (`_Captured`, a BaseException, so no `except Exception` on the way swallows it): nothing trtllm-serve
  would do with its own server afterwards (middlewares, uvicorn, open PR #16939's lifecycle server) runs.

Served name: `OpenAIServer.__init__` serves an existing directory under its folder name (`model_dir.name`), in
every version read (2026: id 54820179511); so does harmony-proxy. 2026 releases bind the port they are given
before building the LLM (id 59682888564: "Failed to bind socket", and `port > 0` asserted): they get a free
loopback port, and another if it was taken in between. Multi-frontend serving (`num_serve_frontends`, PR #16523;
8 by default with open PR #19379): the launcher re-executes the command line for each further front end; harmony-
proxy runs its own (`--workers`), so trtllm-serve is given 1 and the log says so. An LLM built and then not served
(a failure, a refusal) is shut down.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.engines.replaced import replaced

logger = logging.getLogger("harmony_proxy.engine")

_ROLES = ("server_role", "metadata_server_cfg", "disagg_cluster_config")
_DISAGGREGATED = ("disaggregated serving is not run in process: put harmony-proxy --engine upstream in front of "
                  "trtllm-serve's disaggregated deployment")
_BIND_FAILED = "Failed to bind socket"  # 2026 launch_server, before it builds anything (id 59682888564)
_PORT_ATTEMPTS = 3
_PATCHING = threading.Lock()  # trtllm-serve's module names are patched for one run at a time in a process


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


class _Captured(BaseException):
    """Raised by the stand-in server with the LLM trtllm-serve handed it: trtllm-serve goes no further."""

    def __init__(self, llm: Any) -> None:
        super().__init__("captured")
        self.llm = llm


class _PortTaken(Exception):
    """The loopback port given to trtllm-serve was taken before it bound it (nothing was built)."""


def run_trtllm_serve(argv: list[str], on_call: Callable[[ServeCall], None] = lambda call: None) -> Any:
    """Run `trtllm-serve serve ARGV` as installed; return the LLM it built.

    `on_call` sees the `launch_server` call before the LLM is built (it may adjust `llm_args`, or raise).
    """
    for _ in range(_PORT_ATTEMPTS - 1):
        with contextlib.suppress(_PortTaken):
            return _run_once(argv, on_call)
    try:
        return _run_once(argv, on_call)
    except _PortTaken:
        raise TrtllmServeError(f"trtllm-serve could not bind a free loopback port in {_PORT_ATTEMPTS} attempts",
                               1) from None


def _run_once(argv: list[str], on_call: Callable[[ServeCall], None]) -> Any:
    with _PATCHING:
        return _run_patched(argv, on_call)


def _run_patched(argv: list[str], on_call: Callable[[ServeCall], None]) -> Any:
    import tensorrt_llm.serve as servers
    from tensorrt_llm.commands import serve as module

    real_launch = module.launch_server
    signature = inspect.signature(real_launch)

    def launch_server(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        named = dict(bound.arguments)
        for role in _ROLES:
            if named.get(role) is not None:
                raise TrtllmServeError(f"{role}: {_DISAGGREGATED}")
        llm_args = named["llm_args"]
        _one_front_end(llm_args)
        served = served_name(str(named.get("served_model_name") or llm_args["model"]))
        on_call(ServeCall(llm_args, served, named.get("tool_parser"), named))
        real_launch(*bound.args, **bound.kwargs)

    swaps = {"launch_server": launch_server, "OpenAIServer": ServerReplaced}
    with replaced(module, swaps), replaced(servers, {"OpenAIServer": ServerReplaced}):
        try:
            _run_click(module, [*argv, *_loopback_port()])
        except _Captured as captured:
            return captured.llm
    raise TrtllmServeError("trtllm-serve returned without handing its server an LLM: nothing to serve (this "
                           "release builds or serves it in a way harmony-proxy does not know)", 1)


class ServerReplaced:
    """Stands in for trtllm-serve's OpenAIServer: takes the LLM it is given, and stops trtllm-serve there."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        llm = kwargs.get("llm", kwargs.get("generator", args[0] if args else None))
        factory = kwargs.get("generator_factory")  # open PR #17787: the server builds the LLM
        if llm is None and callable(factory):
            llm = factory()
        role = kwargs.get("server_role")
        if role is not None or (llm is not None and not hasattr(llm, "generate_async")):
            _shut_down(llm)
            raise TrtllmServeError(f"trtllm-serve started a {getattr(role, 'name', role) or 'non-LLM'} server: "
                                   "harmony-proxy serves language models only", 1)
        if llm is None:  # e.g. open PR #16939: the server first, serving 503 while it builds the LLM itself
            raise TrtllmServeError("trtllm-serve made its server without an LLM (it would build one while serving): "
                                   "this release's way of starting is not one harmony-proxy can take the LLM from",
                                   1)
        raise _Captured(llm)


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


def served_name(model: str) -> str:
    """The name trtllm-serve's OpenAIServer answers to: a local directory's folder name, else as given."""
    path = Path(model)
    return path.name if path.is_dir() else model


def _one_front_end(llm_args: dict[str, Any]) -> None:
    frontends = llm_args.get("num_serve_frontends")
    if frontends is not None and int(frontends) != 1:
        logger.warning("trtllm-serve would run %s HTTP front ends on this engine (num_serve_frontends; 8 by "
                       "default from PR #19379), each re-running the command line: harmony-proxy runs its own "
                       "instead (--workers, alias --num_serve_frontends), so the engine is built for one",
                       frontends)
        llm_args["num_serve_frontends"] = 1


def _refuse_unservable(params: dict[str, Any], module: Any) -> None:
    """What the parsed command asks that harmony-proxy does not serve, refused before anything is built."""
    if params.get("grpc"):
        raise TrtllmServeError("--grpc: trtllm-serve would serve gRPC; harmony-proxy serves HTTP only (run "
                               "trtllm-serve --grpc itself, or put harmony-proxy --engine upstream in front of an "
                               "HTTP trtllm-serve)")
    for name in ("middleware", "middlewares"):
        if params.get(name):
            raise TrtllmServeError("--middleware: it adds ASGI middlewares to trtllm-serve's own FastAPI app, "
                                   "which harmony-proxy replaces with its server; run them in a proxy in front")
    detect = getattr(module, "get_is_diffusion_model", None)
    if callable(detect) and isinstance(params.get("model"), str):
        try:
            diffusion = bool(detect(params["model"]))
        except Exception:  # noqa: BLE001 - the release's own check; serve() runs it again and reports its errors
            diffusion = False
        if diffusion:
            raise TrtllmServeError(f"{params['model']}: a visual generation model; harmony-proxy serves language "
                                   "models only")


def _run_click(module: Any, argv: list[str]) -> None:
    import click

    command = module.serve
    try:
        with command.make_context("trtllm-serve", list(argv)) as context:
            _refuse_unservable(context.params, module)
            command.invoke(context)
    except click.ClickException as exc:
        raise TrtllmServeError(f"trtllm-serve: {exc.format_message()}", exc.exit_code) from None
    except click.exceptions.Exit as exc:  # --help: printed by click, nothing to serve
        raise TrtllmServeError("trtllm-serve exited without serving", exc.exit_code) from None
    except RuntimeError as exc:
        if _BIND_FAILED in str(exc):
            raise _PortTaken from None
        raise TrtllmServeError(f"trtllm-serve: {type(exc).__name__}: {exc}", 1) from None
    except (ValueError, TypeError, AssertionError, OSError) as exc:  # its YAML and argument checks
        raise TrtllmServeError(f"trtllm-serve: {type(exc).__name__}: {exc}") from None


def _shut_down(llm: Any) -> None:
    shutdown = getattr(llm, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _loopback_port() -> list[str]:
    """A free loopback port for trtllm-serve's own bind (2026 releases bind before building the LLM)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return ["--host", "127.0.0.1", "--port", str(probe.getsockname()[1])]

