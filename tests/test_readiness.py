"""`/ready` beside `/health`, and SIGTERM: not ready first, then drain, then shut down."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.mock import mock_engine
from proxy.state import ServerState
from proxy.store.sqlite import SQLiteResponseStore
from tests.conftest import LiveServer
from tests.grammars import session_matchers
from tests.test_store_processes import LONG, ServerProcess


class UnreachableStore(SQLiteResponseStore):
    """A store whose database has gone away (as a PostgreSQL server that stopped answering)."""

    reachable = True

    async def check(self) -> None:
        if not self.reachable:
            raise ConnectionRefusedError("connection refused")


def test_ready_says_whether_to_send_traffic_and_needs_no_key(
    serve_app: Callable[[Any], LiveServer], vocab: Any, tmp_path: Path
) -> None:
    store = UnreachableStore(tmp_path / "store.sqlite3")
    state = ServerState(ServerConfig(api_key="secret"), vocab, mock_engine(vocab, matchers=session_matchers(vocab)),
                        store)
    server = serve_app(create_app(state))
    ready = httpx.get(server.base_url + "/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    store.reachable = False
    refused = httpx.get(server.base_url + "/ready")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
    assert httpx.get(server.base_url + "/health").status_code == 200  # alive: nothing to restart
    state.draining.draining = True
    store.reachable = True
    draining = httpx.get(server.base_url + "/ready")
    assert draining.status_code == 503 and draining.json()["error"]["code"] == "draining"


def test_sigterm_stops_readiness_first_then_drains(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": LONG}) + "\n", encoding="utf-8")
    server = ServerProcess(script, tmp_path / "store.sqlite3", tmp_path / "server.log", "--drain-seconds", "2")
    try:
        assert httpx.get(server.url + "/ready").status_code == 200
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # Not ready at once, while the 2 s drain still serves (the control: /health answers 200 until it ends).
        while httpx.get(server.url + "/ready", timeout=None).status_code != 503:
            assert server.process.poll() is None
            time.sleep(0.02)
        # Still serving while the balancer catches up: liveness and real requests.
        assert httpx.get(server.url + "/health").status_code == 200
        answered = server.request("POST", "/v1/responses", json={"model": "openai/gpt-oss-20b", "input": "hi",
                                                                    "max_output_tokens": 20})
        assert answered.status_code == 200, (tmp_path / "server.log").read_text()[-3000:]
        answered = answered.json()
        assert answered["status"] == "incomplete"  # 20 tokens of a long answer, served while draining
        assert server.process.poll() is None
        server.process.wait()
        assert time.monotonic() - signalled >= 2  # not before the drain was over
        assert server.process.returncode in (0, -signal.SIGTERM)  # uvicorn ends by the signal it was sent
        assert "draining for 2 s" in (tmp_path / "server.log").read_text()
    finally:
        server.stop()
