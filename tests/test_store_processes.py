"""One Responses store, several server processes (`--workers`): concurrent writes and reads from separate
processes lose or corrupt nothing, and a background response can be watched, cancelled and deleted from a
process that is not running it, without another process's start or restart failing it."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from proxy.responses.transport.jobs import BackgroundJobs
from proxy.store.base import ResponseStore, StoredResponse
from proxy.store.postgres import PostgresResponseStore
from proxy.store.sqlite import SQLiteResponseStore
from tests.conftest import MODEL
from tests.test_responses_resume import same_stream
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
LONG = "<|channel|>final<|message|>" + " word" * 400 + "<|return|>"  # 8 s at 20 ms a token

# -- the store, hammered by separate processes -------------------------------------------------------------------


def _record(writer: int, number: int, done: bool) -> StoredResponse:
    """Response `number` of `writer`, in progress or done; it continues the writer's previous response."""
    text = f"answer {writer}/{number}" + " more" * (number % 40) * 10
    resource = {
        "id": f"resp_{writer}_{number}", "object": "response", "created_at": 1_700_000_000 + number,
        "status": "completed" if done else "in_progress",
        "previous_response_id": f"resp_{writer}_{number - 1}" if number else None,
        "output": [{"id": f"msg_{writer}_{number}", "type": "message", "role": "assistant",
                    "status": "completed" if done else "in_progress",
                    "content": [{"type": "output_text", "text": text if done else text[: len(text) // 2]}]}],
    }
    question = {"id": f"in_{writer}_{number}", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": f"question {writer}/{number}"}]}
    return StoredResponse(resource, [question])


def _items(record: StoredResponse) -> list[dict[str, Any]]:
    return [*record.input_items, *record.resource["output"]]


async def store_at(where: str) -> ResponseStore:
    """The store a SQLite file's path or a PostgreSQL URL names, opened."""
    store: ResponseStore
    store = PostgresResponseStore(where) if where.startswith("postgresql://") else SQLiteResponseStore(Path(where))
    await store.open()
    return store


def _hammer(where: str, writer: int, writers: int, rounds: int) -> list[str]:
    """One process's share: save (in progress, then done), read back, read the others' work, delete."""
    return asyncio.run(_hammer_store(where, writer, writers, rounds))


async def _hammer_store(where: str, writer: int, writers: int, rounds: int) -> list[str]:
    store = await store_at(where)
    rng = random.Random(writer)
    problems: list[str] = []
    try:
        for number in range(rounds):
            partial, final = _record(writer, number, False), _record(writer, number, True)
            await store.save(partial)
            if not await store.save_owned(final):
                problems.append(f"{final.id}: not owned by its writer")
            loaded = await store.load(final.id)
            if loaded is None or loaded.resource != final.resource or loaded.input_items != final.input_items:
                problems.append(f"{final.id}: read back differs")
            chain = await store.history(final.id)
            expected = [item for k in range(number + 1) for item in _items(_record(writer, k, True))]
            if chain != expected:
                problems.append(f"{final.id}: history differs")
            scratch = StoredResponse({**_record(writer, number, True).resource, "id": f"tmp_{writer}_{number}"}, [])
            await store.save(scratch)
            if not await store.delete(scratch.id) or await store.load(scratch.id) is not None:
                problems.append(f"{scratch.id}: not deleted")
            # Another writer's work: absent, or one whole version of it.
            other = rng.choice([w for w in range(writers) if w != writer])
            k = rng.randrange(rounds)
            seen = await store.load(f"resp_{other}_{k}")
            versions = [_record(other, k, False), _record(other, k, True)]
            if seen is not None and (seen.resource, seen.input_items) not in [(v.resource, v.input_items)
                                                                             for v in versions]:
                problems.append(f"resp_{other}_{k}: a torn read")
            found = await store.items([f"in_{other}_{k}", f"msg_{other}_{k}"])
            allowed = [item for v in versions for item in _items(v)]
            problems += [f"{item_id}: a torn item" for item_id, item in found.items() if item not in allowed]
    finally:  # an exception ("database is locked" and the like) reaches the test through the pool
        await store.close()
    return problems


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store is: a SQLite file, or a database of this test's own on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "shared.sqlite3")
    return request.getfixturevalue("postgres_url")


def test_separate_processes_share_one_store(backend: str) -> None:
    writers, rounds = 3, 120 if not backend.startswith("postgresql://") else 25
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(writers, mp_context=context) as pool:
        results = list(pool.map(_hammer, [backend] * writers, range(writers), [writers] * writers,
                                [rounds] * writers))
    assert [problem for problems in results for problem in problems] == []

    async def check() -> None:
        store = await store_at(backend)
        for writer in range(writers):
            for number in range(rounds):
                final = _record(writer, number, True)
                loaded = await store.load(final.id)
                assert loaded is not None and loaded.resource == final.resource, final.id
                assert await store.load(f"tmp_{writer}_{number}") is None
        await store.close()

    asyncio.run(check())
    if backend.startswith("postgresql://"):
        with psycopg.connect(backend) as db:
            assert db.execute("SELECT count(*) FROM responses").fetchone() == (writers * rounds,)
            assert db.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
        return
    with sqlite3.connect(backend) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM responses").fetchone() == (writers * rounds,)
        assert db.execute("SELECT count(*) FROM jobs").fetchone() == (0,)  # every job ended with its response


def test_only_a_dead_owners_jobs_are_ended(backend: str) -> None:
    async def scenario() -> None:
        owner, other = await store_at(backend), await store_at(backend)  # two processes, as the store sees it
        looks = Looks(lease=0.5)
        watcher = BackgroundJobs(other, lease=0.5, clock=looks)
        await owner.save(_record(1, 0, False))
        await owner.save(_record(2, 0, False))
        assert await other.request_cancel("resp_2_0")
        assert not await other.request_cancel("resp_9_9")  # nobody runs it
        assert await owner.cancel_requests() == ["resp_2_0"] and await other.cancel_requests() == []
        for _ in range(10):  # the owner is alive: it renews its heartbeat, and its jobs are left alone
            await watch(watcher, 0.1)
            await owner.renew()
        assert (await other.load("resp_1_0")).resource["status"] == "in_progress"
        looks.mark()  # the owner stops renewing, as a killed process would: a steady lease of looks ends its jobs
        while (await other.load("resp_1_0")).resource["status"] == "in_progress":
            assert looks.steady() < 0.5, "a steady lease of looks since the owner's last renewal left its job"
            await watcher.sweep()
            await asyncio.sleep(0.02)
        failed = (await other.load("resp_1_0")).resource
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_restarted"
        assert failed["output"][0]["status"] == "incomplete"
        assert (await other.load("resp_2_0")).resource["status"] == "cancelled"  # as was asked
        assert not await owner.save_owned(_record(1, 0, True))  # a stalled owner cannot overwrite the ending
        assert (await other.load("resp_1_0")).resource["status"] == "failed"
        await owner.save(_record(3, 0, False))
        await owner.close()  # a process that closes its store gives its jobs up: they end at once
        await BackgroundJobs(other, lease=60).sweep()
        assert (await other.load("resp_3_0")).resource["status"] == "failed"
        await other.close()

    asyncio.run(scenario())


async def watch(watcher: BackgroundJobs, seconds: float) -> None:
    """Look at the heartbeats every 20 ms for `seconds` of the loop's time, as a process's watcher does (every
    lease / 10): the scenario's pace between an owner's renewals, not a bound the test fails at. However few looks
    a busy machine fits in, none sees a heartbeat unchanged for longer than these seconds."""
    until = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < until:
        await watcher.sweep()
        await asyncio.sleep(0.02)


class Looks:
    """A watcher's clock (the event loop's) that notes each of its looks at the heartbeats, so that a test waits
    for a dead owner's job to be ended as long as the watcher has not yet had its chance, however slowly a busy
    machine runs it: the watcher ends a job once it has seen its heartbeat unchanged for a steady lease of looks
    (none more than a quarter lease after the one before: after a longer gap it trusts nothing it saw)."""

    def __init__(self, lease: float) -> None:
        self._lease = lease
        self._times: list[float] = []
        self._mark = 0

    def __call__(self) -> float:
        now = asyncio.get_running_loop().time()
        self._times.append(now)
        return now

    def mark(self) -> None:
        """The owner's heartbeat stops changing now."""
        self._mark = len(self._times)

    def steady(self) -> float:
        """The longest steady stretch of looks since the mark, in seconds; of looks that are over, whose ending
        of the job is in the store if they ended it: the last one may be under way, and the first may have read
        the heartbeats before the mark."""
        times = self._times[self._mark + 1:-1]
        longest, start = 0.0, times[0] if times else 0.0
        for before, now in itertools.pairwise(times):
            if now - before > self._lease / 4:
                start = now
            longest = max(longest, now - start)
        return longest


# -- two real server processes on one store ----------------------------------------------------------------------


class ServerProcess:
    """`python -m proxy serve` with the scripted engine, on a loopback port of its own."""

    def __init__(self, script: Path | None, store: Path | str, log: Path, *options: str) -> None:
        """With no `script`, the mock engine. `store`: a SQLite file, or a PostgreSQL URL."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log
        engine = ["--engine", "scripted", "--script", str(script)] if script is not None else ["--engine", "mock"]
        command = [sys.executable, "-m", "proxy", "serve", *engine, "--token-delay-ms", "20", "--host", "127.0.0.1",
                   "--port", str(self.port), "--store-url" if isinstance(store, str) else "--store-path", str(store),
                   "--shutdown-timeout", "2", *options]
        with log.open("ab") as output:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=output)
        try:
            while True:  # as long as it runs: a start takes seconds, more on a busy machine
                assert self.process.poll() is None, log.read_text()
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, timeout=30, **kwargs)

    def create(self, **body: Any) -> dict[str, Any]:
        response = self.request("POST", "/v1/responses", json={"model": MODEL, "input": "hi", **body})
        assert response.status_code == 200, response.text
        return response.json()

    def get(self, response_id: str) -> dict[str, Any]:
        response = self.request("GET", f"/v1/responses/{response_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def log_text(self) -> str:
        return self._log.read_text(encoding="utf-8", errors="replace")

    def running(self) -> bool:
        """True while the process runs; a failure with its log once it has exited (for `eventually`'s `still`)."""
        assert self.process.poll() is None, self.log_text()
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def _text(resource: dict[str, Any]) -> str:
    return "".join(part["text"] for item in resource["output"] if item["type"] == "message"
                   for part in item["content"])


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Any]:
    """servers(*options) -> a server process on the test's one store; all are stopped at the end."""
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"completion": LONG}) + "\n", encoding="utf-8")
    started: list[ServerProcess] = []

    def start(*options: str) -> ServerProcess:
        started.append(ServerProcess(script, tmp_path / "shared.sqlite3", tmp_path / "servers.log", *options))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def test_background_response_is_watched_and_cancelled_from_another_process(servers: Any) -> None:
    owner = servers("--max-concurrent-requests", "1", "--max-queue", "0")  # a 429 if the job held the engine
    other = servers()
    job = owner.create(background=True)
    while not _text(seen := other.get(job["id"])):  # saved progress, as another worker sees it
        time.sleep(0.05)
    assert seen["status"] == "in_progress"
    time.sleep(1.3)
    later = other.get(job["id"])
    assert later["status"] == "in_progress" and len(_text(later)) > len(_text(seen))  # a long item's text grows
    cancelled = other.request("POST", f"/v1/responses/{job['id']}/cancel")
    # Cancelled, not completed: the cancel reached the owner while the long item was still being written.
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert all(item["status"] != "in_progress" for item in cancelled.json()["output"])
    assert owner.get(job["id"]) == other.get(job["id"]) == cancelled.json()
    quick = owner.create(max_output_tokens=16)  # the engine request was aborted: the owner's one slot is free
    assert quick["status"] == "incomplete"
    time.sleep(0.5)
    assert other.get(job["id"]) == cancelled.json()  # and stays as it ended

    doomed = owner.create(background=True)
    time.sleep(0.3)
    deleted = other.request("DELETE", f"/v1/responses/{doomed['id']}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    time.sleep(1.5)  # past the owner's next progress save: it must not write the response back
    for server in (owner, other):
        assert server.request("GET", f"/v1/responses/{doomed['id']}").status_code == 404
    assert owner.create(max_output_tokens=16)["status"] == "incomplete"


def stream_resumed_from_another(owner: ServerProcess, other: ServerProcess) -> None:
    """A background response started on `owner` is streamed from `other` through the openai SDK while it runs,
    left after its first text delta and resumed after it: the events, numbers and all, a streamed create sends."""
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 100}  # 2 s at 20 ms a token
    expected = list(openai.OpenAI(base_url=owner.url + "/v1", api_key="unused").responses.create(**body, stream=True))
    job = owner.create(**body, background=True)
    client = openai.OpenAI(base_url=other.url + "/v1", api_key="unused", max_retries=0)
    with client.responses.retrieve(job["id"], stream=True) as stream:
        first = []
        for event in stream:
            first.append(event)
            if event.type == "response.output_text.delta":
                break
    assert other.get(job["id"])["status"] == "in_progress"  # it was left while the response ran
    rest = list(client.responses.retrieve(job["id"], stream=True, starting_after=first[-1].sequence_number))
    events = first + rest
    same_stream(events, expected)
    assert events[-1].type == "response.incomplete"
    final = other.get(job["id"])
    assert events[-1].response.model_dump(mode="json", exclude_unset=True) == final
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == _text(final)


def test_a_background_response_is_streamed_from_another_process(servers: Any) -> None:
    stream_resumed_from_another(servers(), servers())


def test_concurrent_writes_through_two_processes(servers: Any) -> None:
    pair = [servers(), servers()]

    def conversation(number: int) -> list[dict[str, Any]]:
        """Three turns, alternating processes, each continuing the last; some in the background."""
        turns: list[dict[str, Any]] = []
        for turn in range(3):
            server = pair[(number + turn) % 2]
            body: dict[str, Any] = {"input": f"turn {turn} of {number}", "max_output_tokens": 16 + turn}
            if turns:
                body["previous_response_id"] = turns[-1]["id"]
            created = server.create(**body, background=number % 3 == 0)
            while created["status"] in ("queued", "in_progress"):
                time.sleep(0.05)
                created = server.get(created["id"])
            turns.append(created)
        return turns

    with ThreadPoolExecutor(8) as pool:
        made = [turn for turns in pool.map(conversation, range(16)) for turn in turns]
    assert len({response["id"] for response in made}) == 48
    for response in made:
        assert response["status"] == "incomplete" and _text(response)
        for server in pair:
            assert server.get(response["id"]) == response
    last = made[-1]
    items = pair[0].request("GET", f"/v1/responses/{last['id']}/input_items").json()["data"]
    assert items[0]["content"][0]["text"] == "turn 2 of 15"


def test_a_restarting_process_leaves_the_others_jobs_running(servers: Any) -> None:
    # A 40 s job (100 ms a token): it outlasts the restart below however loaded the machine is; it is cancelled
    # once the restarted process has left it running.
    owner, other = servers("--token-delay-ms", "100"), servers()
    job = owner.create(background=True, max_output_tokens=400)
    time.sleep(0.3)
    other.stop()  # a worker restarts (its own start-up ends what dead processes left unfinished)
    other = servers()
    running = other.get(job["id"])
    assert running["status"] == "in_progress"
    time.sleep(0.5)
    assert other.get(job["id"])["status"] == "in_progress"  # still running, in its owner: not ended as abandoned
    assert other.request("POST", f"/v1/responses/{job['id']}/cancel").status_code == 200
    # As long as it runs: a cancel that did not reach the owner lets the job complete, the control.
    eventually(lambda: other.get(job["id"])["status"] != "in_progress",
               still=lambda: owner.running() and other.running(), interval=0.1)
    ended = other.get(job["id"])
    assert ended["status"] == "cancelled" and ended["error"] is None
    assert _text(ended)  # what the owner generated before the cancel stands
    assert owner.get(job["id"]) == ended


def test_workers_serve_each_others_background_responses(servers: Any) -> None:
    """`--workers 2`: every call lands on whichever worker accepts it, and each one works."""
    server = servers("--workers", "2")
    jobs = [server.create(background=True) for _ in range(6)]
    time.sleep(1.2)
    for job in jobs:
        progress = server.get(job["id"])
        assert progress["status"] == "in_progress" and _text(progress)
        # Cancelled, not in progress: the worker the cancel landed on had the owner end the job (it waits for that a
        # few seconds at most, then answers the job as it stands).
        cancelled = server.request("POST", f"/v1/responses/{job['id']}/cancel").json()
        assert cancelled["status"] == "cancelled"
        assert server.get(job["id"]) == cancelled


def test_clients_that_stop_reading_at_the_terminal_event_lose_nothing(tmp_path: Path) -> None:
    """The openai SDK idiom `if event.type == "response.completed": break` closes the connection right after the
    terminal event: the response must already be stored then, on whichever worker the next call lands."""
    from openai import AsyncOpenAI, NotFoundError

    script = tmp_path / "short.jsonl"
    script.write_text(json.dumps({"completion": "<|channel|>final<|message|>Hello there.<|return|>"}) + "\n",
                      encoding="utf-8")
    server = ServerProcess(script, tmp_path / "store.sqlite3", tmp_path / "server.log", "--workers", "2",
                           "--token-delay-ms", "0")
    clients, rounds = 24, 5
    broken: list[str | None] = []

    async def client(number: int) -> list[str]:
        sdk = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        ids = []
        previous = None
        for turn in range(rounds):
            try:  # each turn continues the last: a lost one is also a broken conversation
                stream = await sdk.responses.create(model=MODEL, input=f"{number}/{turn}", stream=True,
                                                    previous_response_id=previous)
            except NotFoundError:
                broken.append(previous)
                stream = await sdk.responses.create(model=MODEL, input=f"{number}/{turn}", stream=True)
            async with stream:
                async for event in stream:
                    if event.type == "response.completed":
                        previous = event.response.id
                        break
            ids.append(previous)
        await sdk.close()
        return ids

    async def run_all() -> list[str]:
        return [i for ids in await asyncio.gather(*(client(n) for n in range(clients))) for i in ids]

    try:
        ids = asyncio.run(run_all())
        assert len(set(ids)) == clients * rounds
        lost = [i for i in ids if server.request("GET", f"/v1/responses/{i}").status_code != 200]
        assert lost == [], f"{len(lost)} of {len(ids)} acknowledged responses lost"
        assert broken == []
    finally:
        server.stop()
