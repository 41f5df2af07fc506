"""Run the installed vLLM's own `vllm serve` command-line handling, and keep the arguments instead of its server.

The seam (vLLM 0.32, `vllm/entrypoints/cli/main.py` and `cli/serve.py`): `vllm serve ARGS` builds the `vllm` parser
with the `serve` subcommand's arguments (`ServeSubcommand.subparser_init`: `make_arg_parser`, every engine and
front-end flag, `--config` YAML files, `--model` moved to the front), parses, runs `ServeSubcommand.validate`
(`validate_parsed_serve_args`), then `ServeSubcommand.cmd`, which decides how to serve: one API server in this
process (`run_server`, looked up in `cli/serve.py` when called), several (`run_multi_api_server`, also for the Rust
front end), none (`run_headless`), a data-parallel supervisor (`run_dp_supervisor`), or gRPC (`--grpc`). So:

- the parsing, defaults, config files, validation and error messages are that release's own;
- `run_server` is replaced by one that keeps the arguments: the engine is then built from them by the path
  `run_server` takes (`AsyncEngineArgs.from_cli_args`, `create_engine_config`, `AsyncLLM.from_vllm_config`:
  `engine.py`);
- the other ways to serve are replaced by ones that refuse, with the reason: harmony-proxy is the one HTTP front
  end of one engine client in its process (several front ends: its `--workers`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Callable, Iterator
from typing import Any

from proxy.engines.replaced import replaced

_REFUSED = {
    "run_multi_api_server": "several API server processes (--api-server-count > 1, a data-parallel size that "
                            "defaults to one per rank, or the Rust front end): harmony-proxy is the one front end of "
                            "its engine client; its --workers sets the HTTP processes that share it",
    "run_headless": "--headless (an engine without API server): run `vllm serve --headless` itself, and "
                    "harmony-proxy --engine upstream in front of the deployment's API servers",
    "run_dp_supervisor": "--data-parallel-multi-port-external-lb (a supervisor with one API server per rank): put "
                         "harmony-proxy --engine upstream in front of those servers instead",
}


class VllmServeError(Exception):
    """vLLM refused the command line, or it asks for what harmony-proxy does not serve in process."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_vllm_serve(argv: list[str]) -> argparse.Namespace:
    """`vllm serve ARGV` as the installed vLLM reads it: the arguments its `run_server` would be called with."""
    from vllm.entrypoints.cli import serve as module
    from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG, cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()  # what `vllm` does first: its worker processes are spawned, not forked
    command = module.ServeSubcommand()
    parser = FlexibleArgumentParser(prog="vllm", epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"))
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    kept: list[argparse.Namespace] = []

    async def keep(args: argparse.Namespace, **kwargs: Any) -> None:
        kept.append(args)

    swaps: dict[str, Any] = {"run_server": keep, **{name: _refusing(why) for name, why in _REFUSED.items()}}
    with _vllms_own_errors():
        args = parser.parse_args(["serve", *argv])
        command.validate(args)
        if getattr(args, "grpc", False):
            raise VllmServeError("vllm serve --grpc: harmony-proxy serves the OpenAI APIs over its own HTTP server")
        with replaced(module, swaps):
            command.cmd(args)
    if not kept:
        raise VllmServeError("vllm serve chose no API server to run (nothing to serve)")
    return kept[0]


@contextlib.contextmanager
def _vllms_own_errors() -> Iterator[None]:
    """vLLM's parser writes its usage and error to stderr and exits: keep that text as the error's message."""
    written = io.StringIO()
    try:
        with contextlib.redirect_stderr(written):
            yield
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
        text = written.getvalue().strip()
        if code == 0:  # --help: printed to stdout, nothing to serve
            raise VllmServeError("vllm serve exited without serving", 0) from None
        last = text.splitlines()[-1] if text else "vllm serve: refused the command line"
        raise VllmServeError(last if last.startswith("vllm") else f"vllm serve: {last}", code) from None
    except (ValueError, TypeError) as exc:  # validate_parsed_serve_args and ServeSubcommand.cmd raise these
        raise VllmServeError(f"vllm serve: {exc}") from None
    finally:
        text = written.getvalue()
        if text and "error:" not in text:
            sys.stderr.write(text)  # vLLM's warnings, as it would have written them


def _refusing(why: str) -> Callable[..., None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise VllmServeError(f"vllm serve would run {why}")

    return refuse

