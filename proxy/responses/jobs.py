"""Background responses: generated without the client, saved as they progress, cancellable."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from proxy.responses.run import ResponseRun
from proxy.responses.store import ResponseStore

logger = logging.getLogger("harmony_proxy")


class BackgroundJobs:
    def __init__(self, store: ResponseStore) -> None:
        self._store = store
        self._running: dict[str, tuple[asyncio.Task[None], ResponseRun]] = {}
        self._closing = False

    def start(self, run: ResponseRun) -> None:
        task = asyncio.create_task(self._generate(run), name=f"response {run.id}")
        self._running[run.id] = (task, run)
        task.add_done_callback(lambda _: self._running.pop(run.id, None))

    def get(self, response_id: str) -> ResponseRun | None:
        job = self._running.get(response_id)
        return job[1] if job else None

    async def cancel(self, response_id: str) -> ResponseRun | None:
        """Stop a running job (its engine request is aborted) and save it as cancelled; None if not running."""
        job = self._running.get(response_id)
        if job is None:
            return None
        task, run = job
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return run

    async def close(self) -> None:
        """The server is stopping: running jobs end as failed (nobody cancelled them)."""
        self._closing = True
        for response_id in list(self._running):
            await self.cancel(response_id)

    async def _generate(self, run: ResponseRun) -> None:
        try:
            async for payload in run.events():
                if payload["type"] == "response.output_item.done":
                    await self._store.save(run.record())  # GET shows the progress
        except asyncio.CancelledError:
            if self._closing:
                run.interrupt("server_shutdown", "The server shut down before this response finished.")
            else:
                run.cancel()
        except Exception:
            logger.exception("background response %s failed", run.id)
            run.interrupt("server_error", "The server failed while generating this response.")
        await self._store.save(run.record())
