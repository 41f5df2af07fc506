"""Replicas on one PostgreSQL database (`--store-url`): two server processes on different ports share responses,
chains, conversations and background jobs; SIGKILL of either loses nothing it acknowledged; the database
restarting mid-run gives 503s in OpenAI's shape, and everything recovers when it is back. The store-level tests
of tests/test_store_processes.py run on PostgreSQL too."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from proxy.store import postgres_schema, sqlite_schema
from proxy.store.postgres import PostgresResponseStore
from proxy.store.sqlite import SQLiteResponseStore
from tests.conftest import MODEL
from tests.postgres import PostgresServer
from tests.test_store_processes import LONG, ROOT, ServerProcess, _text, stream_resumed_from_another


@pytest.fixture
def replicas(tmp_path: Path, postgres_url: str) -> Iterator[Any]:
    """replicas(n) -> n server processes on this test's database, started side by side; all are stopped at the
    end."""
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": LONG}) + "\n", encoding="utf-8")
    started: list[ServerProcess] = []

    def start(count: int = 1) -> list[ServerProcess]:
        with ThreadPoolExecutor(count) as pool:
            made = list(pool.map(lambda _: ServerProcess(script, postgres_url, tmp_path / "servers.log"),
                                 range(count)))
        started.extend(made)
        return made

    yield start
    for server in started:
        server.stop()


def _count(server: ServerProcess, **body: Any) -> int:
    response = server.request("POST", "/v1/responses/input_tokens", json={"model": MODEL, "input": "next", **body})
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"]


def _wait(condition: Any, *running: ServerProcess, postgres: PostgresServer | None = None) -> Any:
    """`condition()`'s first true value, waited for as long as it takes (pytest-timeout catches a hang); a failure at
    once, with its log, when a server process in `running` exits, or the PostgreSQL server of `postgres` stops."""
    while not (value := condition()):
        for server in running:
            server.running()
        assert postgres is None or _postgres_runs(postgres), "the PostgreSQL server stopped"
        time.sleep(0.05)
    return value


def _postgres_runs(postgres: PostgresServer) -> bool:
    try:
        pid = int((postgres.folder / "data" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def test_two_replicas_share_one_database(replicas: Any) -> None:
    one, two = replicas(2)
    # A background response started on one: read and cancelled on the other.
    job = one.create(background=True)
    seen = _wait(lambda: _text(got := two.get(job["id"])) and got, one, two)
    assert seen["status"] == "in_progress"
    cancelled = two.request("POST", f"/v1/responses/{job['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"  # not completed: the cancel crossed replicas while the job ran
    assert one.get(job["id"]) == two.get(job["id"]) == cancelled

    # A streamed response on one, read on the other.
    with httpx.stream("POST", one.url + "/v1/responses", timeout=30,
                      json={"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 16}) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert _wait(lambda: two.request("GET", f"/v1/responses/{final['id']}").status_code == 200, one, two)
    assert two.get(final["id"]) == final

    # A chain continued across them: each replica renders the whole chain from the shared store.
    first = one.create(input="first question", max_output_tokens=16)
    second = two.create(input="second question", max_output_tokens=16, previous_response_id=first["id"])
    third = one.create(input="third question", max_output_tokens=16, previous_response_id=second["id"])
    assert third["previous_response_id"] == second["id"]
    assert _count(one, previous_response_id=third["id"]) == _count(two, previous_response_id=third["id"]) \
        > _count(two, previous_response_id=second["id"]) > _count(one, previous_response_id=first["id"])
    assert two.request("GET", f"/v1/responses/{third['id']}/input_items").json()["data"][0]["content"][0][
        "text"] == "third question"

    # A conversation: made on one, a response in it on the other, its items listed on the first.
    conversation = one.request("POST", "/v1/conversations", json={"items": [{"role": "user",
                                                                              "content": "I am in Paris."}]}).json()
    answered = two.create(input="Weather?", conversation=conversation["id"], max_output_tokens=16)
    listed = one.request("GET", f"/v1/conversations/{conversation['id']}/items", params={"order": "asc"}).json()
    assert [item["id"] for item in listed["data"][1:]] == [
        two.request("GET", f"/v1/responses/{answered['id']}/input_items").json()["data"][0]["id"],
        *(item["id"] for item in answered["output"])]
    assert _count(one, conversation=conversation["id"]) == _count(two, conversation=conversation["id"])


def test_a_background_response_is_streamed_from_another_replica(replicas: Any) -> None:
    stream_resumed_from_another(*replicas(2))


def test_sigkill_loses_nothing_acknowledged(replicas: Any) -> None:
    one, two = replicas(2)
    acknowledged: list[dict[str, Any]] = []
    conversation = one.request("POST", "/v1/conversations", json={}).json()
    for n, server in enumerate([one, two, one, two]):
        added = server.request("POST", f"/v1/conversations/{conversation['id']}/items",
                               json={"items": [{"role": "user", "content": f"m{n}"}]})
        assert added.status_code == 200
        acknowledged.append(server.create(input=f"q{n}", max_output_tokens=16))
    job = one.create(background=True)
    _wait(lambda: _text(two.get(job["id"])), one, two)
    for victim, survivor in [(one, two), (two, None)]:
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=30)
        if survivor is not None:
            assert survivor.get(job["id"])["status"] == "in_progress"  # its owner's lease has not run out yet
    (three,) = replicas()
    for response in acknowledged:
        assert three.get(response["id"]) == response
    items = three.request("GET", f"/v1/conversations/{conversation['id']}/items", params={"order": "asc"}).json()
    assert [item["content"][0]["text"] for item in items["data"]] == ["m0", "m1", "m2", "m3"]
    assert _text(three.get(job["id"]))  # the progress saved before the kill


def test_database_restart_gives_503s_and_recovers(replicas: Any, postgres: PostgresServer, postgres_url: str) -> None:
    (server,) = replicas()
    kept = server.create(input="kept", max_output_tokens=16)
    job = server.create(background=True, max_output_tokens=100)  # about 2 s at 20 ms a token
    _wait(lambda: _text(server.get(job["id"])), server)
    postgres.stop()
    try:
        for method, path, body in [("GET", f"/v1/responses/{kept['id']}", None),
                                   ("POST", "/v1/responses", {"model": MODEL, "input": "hi",
                                                              "previous_response_id": kept["id"]}),
                                   ("POST", "/v1/conversations", {})]:
            response = server.request(method, path, json=body)
            assert response.status_code == 503, response.text
            assert response.json()["error"] == {"message": "The response store is unavailable; retry shortly.",
                                                "type": "server_error", "param": None, "code": "store_unavailable"}
            assert response.headers["retry-after"] == "2"
        # Generated, but not stored: the response says so rather than announce itself stored.
        lost = server.create(input="hi", max_output_tokens=16)
        assert lost["status"] == "failed" and lost["error"]["code"] == "store_unavailable"
        assert server.request("GET", "/health").status_code == 200  # the process itself is fine
        assert server.request("GET", "/ready").json()["error"]["code"] == "store_unavailable"  # send no traffic
        # The background response ends while the database is away (its process shows it until it is saved).
        _wait(lambda: server.get(job["id"])["status"] == "incomplete", server)
    finally:
        postgres.start()

    def stored_status() -> str | None:
        with psycopg.connect(postgres_url) as db:
            row = db.execute("SELECT status FROM responses WHERE id = %s", (job["id"],)).fetchone()
        return row[0] if row and row[0] not in ("queued", "in_progress") else None

    # Its end was saved once the database was back.
    assert _wait(stored_status, server, postgres=postgres) == "incomplete"
    assert _wait(lambda: server.request("GET", f"/v1/responses/{kept['id']}").status_code == 200, server,
                 postgres=postgres)
    assert server.request("GET", "/ready").status_code == 200
    assert server.get(job["id"])["status"] == "incomplete"
    follow = server.create(input="again", max_output_tokens=16, previous_response_id=kept["id"])
    assert follow["previous_response_id"] == kept["id"]
    assert server.request("GET", f"/v1/responses/{lost['id']}").status_code == 404

    # A server told to stop while the database is away stops, within its shutdown timeout, without hanging on
    # the saves it cannot make (another replica ends its job once the heartbeat is older than the lease).
    running = server.create(background=True)
    _wait(lambda: _text(server.get(running["id"])), server)
    postgres.stop()
    try:
        asked = time.monotonic()
        server.stop()
        assert time.monotonic() - asked < 10
    finally:
        postgres.start()
    log = server.log_text()
    assert "failed as the server stops" in log and "giving up this process's jobs failed" in log
    assert log.rstrip().endswith(f"Finished server process [{server.process.pid}]")  # shut down, not crashed


def test_schema_is_created_and_migrated(tmp_path: Path, postgres_url: str) -> None:
    """A SQLite file from before versions were kept (version 0, no conversation tables) is migrated in place; a
    PostgreSQL database is created by replicas starting at once, and each schema stays at the last version."""
    old = tmp_path / "old.sqlite3"
    with sqlite3.connect(old) as db:
        db.executescript(sqlite_schema.MIGRATIONS[0])
        db.execute("INSERT INTO responses VALUES ('resp_old', NULL, 'completed', 1, ?, '[]')",
                   (json.dumps({"id": "resp_old", "status": "completed", "output": []}),))

    async def scenario() -> None:
        store = SQLiteResponseStore(old)
        assert (await store.load("resp_old")).resource["status"] == "completed"
        await store.create_conversation({"id": "conv_1", "created_at": 1, "metadata": {}}, [])
        await store.close()
        stores = [PostgresResponseStore(postgres_url) for _ in range(3)]
        await asyncio.gather(*(store.open() for store in stores))
        await stores[0].create_conversation({"id": "conv_1", "created_at": 1, "metadata": {}}, [])
        for store in stores:
            assert await store.load_conversation("conv_1") is not None
            await store.close()
        again = PostgresResponseStore(postgres_url)
        await again.open()
        await again.close()

    asyncio.run(scenario())
    with sqlite3.connect(old) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (len(sqlite_schema.MIGRATIONS),)
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [
            (number,) for number in range(1, len(postgres_schema.MIGRATIONS) + 1)]


@pytest.mark.parametrize("options, says", [
    (["--store-url", "mysql://user@127.0.0.1/db"], "--store-url takes a PostgreSQL URL"),
    (["--store-url", "postgresql://user@127.0.0.1/db", "--store-path", "x.sqlite3"], "name two stores"),
    (["--store-url", "postgresql://user:hunter22@127.0.0.1:1/db"],
     "cannot connect to the PostgreSQL store 127.0.0.1:1/db"),
])
def test_a_store_that_cannot_be_used_stops_the_start(options: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--engine", "mock", "--port", "0", *options],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode != 0 and says in done.stderr + done.stdout
    assert "hunter22" not in done.stderr + done.stdout  # a password never reaches the log
