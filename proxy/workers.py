"""`--workers N`: N HTTP front-end processes sharing one listening socket (vLLM's `--api-server-count`).

Each worker is a uvicorn worker process that rebuilds the server from the same command line (passed in the
environment) and serves on the shared socket; uvicorn's supervisor restarts a worker that dies. With the
mock, scripted and upstream engines each worker has its own engine. With trtllm there is one engine: a host
process builds the `LLM` in its own main thread (as trtllm-serve does; TensorRT-LLM's MPI start-up and signal
handling assume it) and serves it over a Unix socket; the workers render, parse and serialize, and only token
ids cross (`proxy/engines/host.py`, `proxy/engines/remote.py`). While the model loads, workers answer /health
with 503.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from uvicorn.supervisors import Multiprocess

from proxy.access_log import configure_logging
from proxy.metrics import MULTIPROCESS_ENV
from proxy.responses.sealing import KEY_ENV

logger = logging.getLogger("harmony_proxy")
ARGV_ENV = "HARMONY_PROXY_WORKER_ARGV"  # the command line, as JSON, for workers to rebuild the server from
ENGINE_SOCKET_ENV = "HARMONY_PROXY_ENGINE_SOCKET"  # the trtllm engine host's socket, when there is one


def serve_workers(args: argparse.Namespace, argv: list[str], engine_name: str) -> None:
    from proxy.cli import uvicorn_options

    os.environ[ARGV_ENV] = json.dumps(argv)
    if args.reasoning_key is None:  # one random key for all the workers, or a blob opens in one worker only
        os.environ[KEY_ENV] = secrets.token_urlsafe(32)
        logger.warning("no --reasoning-key (or %s): encrypted_content is sealed with a random key made now; "
                       "blobs stop opening after a restart and on other replicas", KEY_ENV)
    metrics_dir = _metrics_folder()
    config = uvicorn.Config("proxy.workers:worker_app", factory=True, workers=args.workers, **uvicorn_options(args))
    listening = config.bind_socket()  # before the engine host starts: a port in use stops everything at once
    host, socket_path = None, Path()
    if engine_name == "trtllm":
        socket_path = Path(tempfile.mkdtemp(prefix="harmony-proxy-")) / "engine.sock"
        os.environ[ENGINE_SOCKET_ENV] = str(socket_path)
        host = multiprocessing.get_context("spawn").Process(
            target=_run_trtllm_host, args=(argv, str(socket_path)), name="harmony-proxy-engine"
        )
        host.start()
        logger.info("trtllm engine host started (pid %d); workers connect to %s", host.pid, socket_path)
    try:
        Multiprocess(config, sockets=[listening]).run()
    finally:
        if host is not None:
            host.terminate()  # SIGTERM: the host aborts what is left and shuts the LLM down
            host.join(timeout=args.shutdown_timeout + 30)
            if host.is_alive():
                host.kill()
            shutil.rmtree(socket_path.parent, ignore_errors=True)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def worker_app() -> Starlette:
    """The application of one worker process (uvicorn calls this factory in each worker)."""
    from proxy.app import create_app
    from proxy.cli import build_parser, build_state, engine_choice, freeze_startup_objects

    args = build_parser().parse_args(json.loads(os.environ[ARGV_ENV]))
    configure_logging(args.log_level, args.log_format)
    engine_name = engine_choice(args)
    engine = None
    if engine_name == "trtllm":
        from proxy.engines.remote import RemoteEngine

        engine = RemoteEngine(os.environ[ENGINE_SOCKET_ENV], name="trtllm")
    app = create_app(build_state(args, engine_name, engine))
    freeze_startup_objects()
    return app


def _run_trtllm_host(argv: list[str], socket_path: str) -> None:
    """The engine host process's main function: the LLM is built in this process's main thread."""
    from proxy.cli import build_parser, trtllm_arguments
    from proxy.engines.host import run_engine_host
    from proxy.engines.trtllm import loaded_trtllm_engine

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    arguments = trtllm_arguments(args)
    run_engine_host(functools.partial(loaded_trtllm_engine, arguments), socket_path, args.log_level)


def _metrics_folder() -> Path | None:
    """Where the workers' metrics meet (prometheus-client's multi-process mode): a folder of our own, removed at
    exit, so that no count outlives the server; None when the user named one, which is then theirs to clear."""
    if os.environ.get(MULTIPROCESS_ENV):
        logger.warning("%s is set: metrics go to %s, which must be emptied between runs", MULTIPROCESS_ENV,
                       os.environ[MULTIPROCESS_ENV])
        return None
    folder = Path(tempfile.mkdtemp(prefix="harmony-proxy-metrics-"))
    os.environ[MULTIPROCESS_ENV] = str(folder)  # the workers, spawned after this, write their metrics there
    logger.info("the workers' metrics are gathered in %s", folder)
    return folder
