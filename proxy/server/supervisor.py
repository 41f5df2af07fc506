"""The supervisor of `--workers` processes: uvicorn's, with a start-up allowance and a reason for every
replacement.

uvicorn's supervisor pings each worker every half second over a pipe, answered by a thread of the worker, and kills
a worker that does not answer within `timeout_worker_healthcheck` (5 s by default), starting another. A worker
that is starting holds the GIL for seconds at a time in native code (the Harmony vocabulary, the grammar tables):
on a loaded machine it could not answer in 5 s, was killed, and its replacement met the same fate (a start of
73-125 s instead of 7, logged as "Child process died"). Here a worker that has not yet started serving has
START_TIMEOUT to do so, whatever its pings; a serving worker still has to answer within HEALTHCHECK_TIMEOUT.
Every worker replaced is logged with why: it exited (its code or signal), it did not start in time, or it stopped
answering. Once every worker serves, the supervisor logs "Uvicorn running on ..." (`proxy/server/readiness.py`).
"""

from __future__ import annotations

import logging
import signal
import time
from socket import socket

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from proxy.server.readiness import announce

logger = logging.getLogger("harmony_proxy")
START_TIMEOUT = 600.0  # seconds a worker may take to start serving
HEALTHCHECK_TIMEOUT = 30  # seconds a serving worker may leave a ping unanswered (uvicorn's default: 5)
_STARTING_PING = 0.5  # seconds the supervisor waits for a starting worker's answer before it looks at the others


class Supervisor(Multiprocess):
    def __init__(self, config: Config, sockets: list[socket], start_timeout: float = START_TIMEOUT) -> None:
        super().__init__(config, sockets)
        self._start_timeout = start_timeout
        self._born: dict[Process, float] = {}  # a starting worker: when the supervisor first saw it
        self._serving: set[Process] = set()
        self._announced = False

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for index, process in enumerate(self.processes):
            reason = self._trouble(process)
            if reason is None:
                continue
            process.kill()
            process.join()
            self._born.pop(process, None)
            self._serving.discard(process)
            if process.exitcode == STARTUP_FAILURE:  # its application failed to start: so would every other
                logger.error("worker process [%s] failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            logger.error("worker process [%s] %s; starting another", process.pid, reason)
            self.processes[index] = Process(self.config, self.sockets)
            self.processes[index].start()
        if not self._announced and all(process in self._serving for process in self.processes):
            self._announced = True
            announce(self.sockets[0])

    def _trouble(self, process: Process) -> str | None:
        """Why `process` must be replaced, or None while it is well (serving, or starting within its time)."""
        if not process.process.is_alive():
            code = process.process.exitcode
            if code is not None and code < 0:
                return f"was killed by {signal.Signals(-code).name}"
            return f"exited with code {code}"
        if process in self._serving:
            if process.ping(timeout=self.config.timeout_worker_healthcheck):
                return None
            return (f"did not answer the supervisor's health check within "
                    f"{self.config.timeout_worker_healthcheck:g} s (hung, or starved of CPU)")
        born = self._born.setdefault(process, time.monotonic())
        if process.is_ready(timeout=_STARTING_PING):
            self._serving.add(process)
            self._born.pop(process, None)
            return None
        if time.monotonic() - born > self._start_timeout:
            return f"did not start serving within {self._start_timeout:g} s"
        return None
