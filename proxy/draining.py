"""Readiness for load balancers, and a graceful exit: on SIGTERM stop being ready first, then drain.

A load balancer or Kubernetes sends traffic while `GET /ready` answers 200. On SIGTERM the server says 503 on
`/ready` at once, keeps serving for `--drain-seconds` (time for the balancer to notice and stop sending), and only
then hands the signal to uvicorn, which stops accepting and waits for the requests in flight (up to
`--shutdown-timeout`). A second SIGTERM, or SIGINT (Ctrl-C), exits without the wait.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("harmony_proxy")


class Draining:
    """Whether the server is leaving; `install` takes SIGTERM over from uvicorn's handler for the drain."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.draining = False
        self._timer: threading.Timer | None = None

    def install(self) -> Callable[[], None]:
        """Wrap the SIGTERM handler in place (uvicorn's, while it serves); returns what puts it back. Only the main
        thread can set signal handlers: elsewhere (a server in a test thread) nothing is installed."""
        if self.seconds <= 0 or threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous):  # not served by uvicorn: nothing to hand the signal on to
            return lambda: None

        def on_sigterm(number: int, frame: FrameType | None) -> None:
            if self.draining:
                previous(number, frame)
                return
            self.draining = True
            logger.info("SIGTERM: not ready from now; draining for %.0f s before shutting down", self.seconds)
            self._timer = threading.Timer(self.seconds, previous, (number, frame))
            self._timer.daemon = True
            self._timer.start()

        signal.signal(signal.SIGTERM, on_sigterm)

        def uninstall() -> None:
            if self._timer is not None:
                self._timer.cancel()
            if signal.getsignal(signal.SIGTERM) is on_sigterm:
                signal.signal(signal.SIGTERM, previous)

        return uninstall
