"""`--workers N`: N HTTP front-end processes sharing one listening socket (vLLM's `--api-server-count`).

Each worker is a uvicorn worker process that rebuilds the server from the same command line (passed in the
environment) and serves on the shared socket; the supervisor (`proxy/server/supervisor.py`, uvicorn's with a
start-up allowance) restarts a worker that dies or hangs, saying why. With the
mock, scripted and upstream engines each worker has its own engine. With trtllm (or vllm) there is one engine: a host
process builds the `LLM` in its own main thread (as trtllm-serve does; TensorRT-LLM's MPI start-up and signal
handling assume it) and serves it over a Unix socket; the workers render, parse and serialize, and only token
ids cross (`proxy/engines/host.py`, `proxy/engines/remote.py`). While the model loads, workers answer /health
with 503.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from proxy.responses.sealing import KEY_ENV
from proxy.server.readiness import bind
from proxy.server.supervisor import HEALTHCHECK_TIMEOUT, Supervisor
from proxy.telemetry.metrics import MULTIPROCESS_ENV

logger = logging.getLogger("harmony_proxy")
WORKER_APP = "proxy.server.cli:worker_app"  # the factory uvicorn calls in each worker process
ARGV_ENV = "HARMONY_PROXY_WORKER_ARGV"  # the command line, as JSON, for workers to rebuild the server from
ENGINE_SOCKET_ENV = "HARMONY_PROXY_ENGINE_SOCKET"  # the trtllm engine host's socket, when there is one


def serve_workers(args: argparse.Namespace, argv: list[str], engine_name: str, options: dict[str, Any],
                  host_main: Callable[[list[str], str], None]) -> None:
    """Supervise `args.workers` processes serving WORKER_APP with uvicorn `options`; with trtllm, one engine host
    process running `host_main(argv, socket_path)` too. The entry points are the CLI's (`proxy/server/cli.py`): each
    process rebuilds the server from `argv`."""
    os.environ[ARGV_ENV] = json.dumps(argv)
    if args.reasoning_key is None:  # one random key for all the workers, or a blob opens in one worker only
        os.environ[KEY_ENV] = secrets.token_urlsafe(32)
        logger.warning("no --reasoning-key (or %s): encrypted_content is sealed with a random key made now; "
                       "blobs stop opening after a restart and on other replicas", KEY_ENV)
    metrics_dir = _metrics_folder()
    config = uvicorn.Config(WORKER_APP, factory=True, workers=args.workers,
                            timeout_worker_healthcheck=HEALTHCHECK_TIMEOUT, **options)
    listening = bind(args.host, args.port)  # before the engine host starts: a port in use stops everything at once
    host, socket_path = None, Path()
    if engine_name in ("trtllm", "vllm"):
        socket_path = Path(tempfile.mkdtemp(prefix="harmony-proxy-")) / "engine.sock"
        os.environ[ENGINE_SOCKET_ENV] = str(socket_path)
        host = multiprocessing.get_context("spawn").Process(
            target=host_main, args=(argv, str(socket_path)), name="harmony-proxy-engine"
        )
        host.start()
        logger.info("%s engine host started (pid %d); workers connect to %s", engine_name, host.pid, socket_path)
    try:
        Supervisor(config, sockets=[listening]).run()
    finally:
        if host is not None:
            host.terminate()  # SIGTERM: the host aborts what is left and shuts the LLM down
            host.join(timeout=args.shutdown_timeout + 30)
            if host.is_alive():
                host.kill()
            shutil.rmtree(socket_path.parent, ignore_errors=True)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


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
