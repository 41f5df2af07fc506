"""Background responses: generated without the client, saved as they progress, cancellable from any process.

Several server processes (`--workers`) can share one store; a background response runs in the process that created
it, which owns it in the store (the store records the owner and a heartbeat). The owner saves the response on each
finished output item and at least every PROGRESS_EVERY seconds, with its streaming events since the last save, so a
GET on any process shows the progress, and a streamed GET replays and follows the events
(`proxy/responses/transport/resume.py`).
Another process cancels (or deletes) it by recording a cancel request; the owner
polls for those every POLL_EVERY seconds, cancels the job (its engine request is aborted) and saves it, while the
other process waits for the store to show it ended. The owner renews its heartbeat every lease / 5.

Every process watches the heartbeats of the unfinished responses (every lease / 10) and ends those whose owner died,
so they never finish: at once those with no owner (given up by a process that stopped), and those whose heartbeat
it has seen unchanged for a lease of its own steady watching. Steady: each look succeeded within lease / 4 of the
one before. A look that failed or took longer (the database was down or frozen, or this process stalled) starts
the count again, so that after an outage the owners, which could not renew either, get a whole lease to do it
before anyone judges them: a heartbeat's age on the database's clock says nothing across an outage. The end is
saved only if the heartbeat is still the one seen (`ResponseStore.end_abandoned`), so a renewal that lands first
wins. A job whose record its process no longer owns (deleted, or ended as abandoned after this process stalled
for longer than the lease) stops without saving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from proxy.responses.run import ResponseRun
from proxy.store.base import UNFINISHED, ResponseStore, StoredResponse, StoreUnavailable
from proxy.telemetry.request_record import run_detached

logger = logging.getLogger("harmony_proxy")

LEASE = 10.0  # seconds without a heartbeat after which a process is taken for dead
POLL_EVERY = 0.2  # seconds between the owner's looks for cancel requests
PROGRESS_EVERY = 1.0  # seconds between saves of a long item's text
CANCEL_WAIT = 5.0  # seconds a cancel waits for another process to end the job
RETRY_EVERY = 1.0  # seconds between tries of a final save while the store is unavailable
_ENDED = {"response.completed", "response.incomplete", "response.failed"}


class _Lost(Exception):
    """The store no longer has this job as ours."""


class BackgroundJobs:
    def __init__(self, store: ResponseStore, lease: float = LEASE, clock: Callable[[], float] | None = None) -> None:
        """`clock`: the seconds the watcher judges heartbeats by; the event loop's by default (a test drives it)."""
        self._store = store
        self._lease = lease
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._seen: dict[str, tuple[float | None, float]] = {}  # response id: (heartbeat, loop time first seen)
        self._looked: float | None = None  # the loop time of the last look at the heartbeats that succeeded
        self._store_down = False  # the watcher's last store operation failed
        self._running: dict[str, tuple[asyncio.Task[None], ResponseRun]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False

    async def open(self) -> None:
        """End what dead processes left unfinished, then keep watching for cancel requests and dead owners."""
        await self.sweep()
        self._watcher = asyncio.create_task(self._watch(), name="background jobs")

    def start(self, run: ResponseRun) -> None:
        """Run a response that was saved as queued (which made it this process's job)."""
        # Measured and logged on its own: its POST was answered before it generates (proxy/telemetry/request_record.py).
        task = run_detached(self._generate(run), f"response {run.id}", "/v1/responses", "responses")
        self._running[run.id] = (task, run)
        task.add_done_callback(lambda _: self._running.pop(run.id, None))

    def get(self, response_id: str) -> ResponseRun | None:
        job = self._running.get(response_id)
        return job[1] if job else None

    async def cancel(self, response_id: str, wait: float = CANCEL_WAIT) -> dict[str, Any] | None:
        """Cancel a background response in whichever process runs it; the response as it then stands, None if
        not stored. When another process runs it, wait up to `wait` seconds for that process to end it."""
        job = self._running.get(response_id)
        if job is not None:
            return (await self._stop(job)).resource()
        if await self._store.request_cancel(response_id):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while loop.time() < deadline:
                record = await self._store.load(response_id)
                if record is None or record.resource["status"] not in UNFINISHED:
                    return record.resource if record else None
                await asyncio.sleep(0.05)
        record = await self._store.load(response_id)
        return record.resource if record else None

    async def sweep(self) -> None:
        """Look at the heartbeats, and end the unfinished responses of processes that died (see the module's
        docstring): those with no owner, and those whose heartbeat was seen unchanged for a steady lease."""
        heartbeats = await self._store.heartbeats()
        now = self._clock()
        if self._looked is None or now - self._looked > self._lease / 4:
            self._seen = {}  # not steady: the owners may not have been able to renew either
        self._looked = now
        seen, stale = {}, {}
        for response_id, heartbeat in heartbeats.items():
            before = self._seen.get(response_id)
            since = before[1] if before is not None and before[0] == heartbeat else now
            seen[response_id] = (heartbeat, since)
            if heartbeat is None or now - since >= self._lease:
                stale[response_id] = heartbeat
        self._seen = seen
        if stale:
            for response_id in await self._store.end_abandoned(stale, _end_abandoned):
                logger.warning("response %s was left unfinished by a server process that stopped; ended it",
                               response_id)

    async def close(self) -> None:
        """The server is stopping: running jobs end as failed (nobody cancelled them)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._closing = True
        for job in list(self._running.values()):
            await self._stop(job)

    async def _stop(self, job: tuple[asyncio.Task[None], ResponseRun]) -> ResponseRun:
        task, run = job
        task.cancel()
        await asyncio.wait([task])  # unlike `await task`, a cancel of our own still reaches us
        if run.resource()["status"] in UNFINISHED:  # cancelled before it began, so nothing ended it
            self._halt(run)
            await self.save_end(run.record())
        return run

    def _halt(self, run: ResponseRun) -> None:
        if self._closing:
            run.interrupt("server_shutdown", "The server shut down before this response finished.")
        else:
            run.cancel()

    async def _generate(self, run: ResponseRun) -> None:
        try:
            await self._follow(run)
            return  # the run saved its end (`save_end`) before its terminal event
        except asyncio.CancelledError:
            if run.end_saved:  # cancelled while its end was being saved: that save stands
                return
            self._halt(run)
        except _Lost:
            logger.warning("response %s was deleted or ended by another server process; stopped it", run.id)
            return
        except Exception:
            logger.exception("background response %s failed", run.id)
            run.interrupt("server_error", "The server failed while generating this response.")
        await self.save_end(run.record())

    async def save_end(self, record: StoredResponse) -> bool:
        """Save a job's ending (`save_owned`). It must reach the store: while the database is away, try again (this
        process still owns the job and renews it, so no other process ends it meanwhile), unless stopping.
        False when it was not saved: the job is no longer this process's, or the server stops."""
        tries = 0
        while True:
            try:
                return await self._store.save_owned(record)
            except StoreUnavailable as exc:
                if self._closing:  # its heartbeat stops with this process: another one ends it after the lease
                    logger.warning("saving the end of response %s failed as the server stops: %s", record.id, exc)
                    return False
                if not tries:  # once: the store says when it is back
                    logger.warning("saving the end of response %s failed; trying again every %g s until the store "
                                   "answers: %s", record.id, RETRY_EVERY, exc)
                tries += 1
                await asyncio.sleep(RETRY_EVERY)

    async def _follow(self, run: ResponseRun) -> None:
        """Generate, saving the progress on each finished item and at least every PROGRESS_EVERY seconds."""
        saved, failing = time.monotonic(), False
        async with contextlib.aclosing(run.batches()) as batches:  # leaving early aborts the engine request
            async for batch in batches:
                last = batch[-1] if batch else None
                if type(last) is dict and last["type"] in _ENDED:
                    continue  # saved by the run already
                now = time.monotonic()
                if now - saved >= PROGRESS_EVERY or any(
                    type(payload) is dict and payload["type"] == "response.output_item.done" for payload in batch
                ):
                    saved = now
                    record = run.record()  # with the events since the last save (the stream's, for a resume)
                    try:
                        owned = await self._store.save_owned(record)
                    except StoreUnavailable as exc:  # the database is away: generation goes on, a later save lands
                        if not failing:
                            logger.warning("saving the progress of response %s failed (kept for a later save): %s",
                                           run.id, exc)
                        failing = True
                        continue
                    if not owned:
                        raise _Lost
                    failing = False
                    run.saved(record)

    async def _watch(self) -> None:
        """The owner's side: act on cancel requests, renew the heartbeat; everyone's: end dead owners' jobs."""
        loop = asyncio.get_running_loop()
        renewed = swept = loop.time()
        while True:
            await asyncio.sleep(POLL_EVERY)
            try:
                if self._running:
                    for response_id in await self._store.cancel_requests():
                        job = self._running.get(response_id)
                        if job is not None:
                            await self._stop(job)
                    if loop.time() - renewed >= self._lease / 5:
                        await self._store.renew()
                        renewed = loop.time()
                if loop.time() - swept >= self._lease / 10:
                    await self.sweep()
                    swept = loop.time()
                if self._store_down:
                    logger.info("background jobs: the store answers again")
                    self._store_down = False
            except StoreUnavailable as exc:  # one line when it starts, not one a poll
                if not self._store_down:
                    logger.warning("background jobs wait for the store: %s", exc)
                    self._store_down = True
            except Exception:  # a busy or failing disk must not end the watch
                logger.exception("watching background responses failed")


def _end_abandoned(record: StoredResponse, cancel_requested: bool) -> None:
    """A response whose process died: cancelled if someone asked for that, else failed."""
    resource = record.resource
    if cancel_requested:
        resource["status"] = "cancelled"
    else:
        resource.update(status="failed", error={
            "code": "server_restarted",
            "message": "The server process generating this response stopped before it finished.",
        })
    resource["completed_at"] = int(time.time())
    for item in resource["output"]:
        if item.get("status") == "in_progress":
            item["status"] = "incomplete"
