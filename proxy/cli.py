"""`harmony-proxy serve` (also `python -m proxy serve`): parse options, load the vocabulary, serve."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from parsers.vocab import Vocab, VocabError, load_vocab
from proxy.app import create_app
from proxy.config import EFFORTS, REASONING_FIELDS, ServerConfig
from proxy.engines.base import Engine
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import ScriptError, read_script, scripted_engine
from proxy.state import ServerState

logger = logging.getLogger("harmony_proxy")
ENGINES = ("mock", "scripted")


class StartupError(Exception):
    """A problem with the options or files, reported in one line before anything is served."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harmony-proxy", description="OpenAI-compatible server for gpt-oss.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI APIs over HTTP")
    serve.add_argument("--engine", choices=ENGINES, help="default: mock when TensorRT-LLM is not installed")
    serve.add_argument("--script", type=Path, help="JSON Lines completions for --engine scripted")
    serve.add_argument("--token-delay-ms", type=float, default=0.0, help="delay between scripted/mock tokens")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=ServerConfig.served_model_name)
    serve.add_argument("--reasoning-field", choices=REASONING_FIELDS, default=ServerConfig.reasoning_field)
    serve.add_argument("--default-reasoning-effort", choices=EFFORTS, default=ServerConfig.default_reasoning_effort)
    serve.add_argument("--max-model-len", type=int, default=ServerConfig.max_model_len,
                       help="context window: prompt plus output tokens")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        engine_name = _choose_engine(args)
        vocab = load_vocab()
        engine = _build_engine(engine_name, args, vocab)
    except (StartupError, VocabError, ScriptError) as exc:
        print(f"harmony-proxy: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    config = ServerConfig(
        served_model_name=args.served_model_name,
        reasoning_field=args.reasoning_field,
        default_reasoning_effort=args.default_reasoning_effort,
        max_model_len=args.max_model_len,
    )
    app = create_app(ServerState(config, vocab, engine))
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, log_level=args.log_level)


def _choose_engine(args: argparse.Namespace) -> str:
    if args.engine:
        logger.info("serving %s with the %s engine", args.served_model_name, args.engine)
        return args.engine
    if importlib.util.find_spec("tensorrt_llm") is not None:
        raise StartupError("TensorRT-LLM is installed but its engine is not available yet; pass --engine mock")
    logger.info(
        "no --engine given and TensorRT-LLM is not installed: serving the built-in MOCK engine "
        "(no model weights; answers are placeholders)"
    )
    return "mock"


def _build_engine(name: str, args: argparse.Namespace, vocab: Vocab) -> Engine:
    delay = args.token_delay_ms / 1000
    if name == "scripted":
        if args.script is None:
            raise StartupError("--engine scripted needs --script FILE (JSON Lines of {\"completion\": ...})")
        return scripted_engine(vocab, read_script(args.script), delay)
    if args.script is not None:
        raise StartupError("--script is only used with --engine scripted")
    return mock_engine(vocab, delay)
