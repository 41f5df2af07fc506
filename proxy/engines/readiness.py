"""When an engine serves: `until_serving` returns once it does, saying while it waits why it does not yet.

An engine started is not yet an engine that serves: an upstream may not be listening (started after the front end,
or down), the engine host of `--workers` may not have connected. The server logs "the ... engine is ready" when
`until_serving` returns (`proxy/app.py`): when /health answers 200, never before.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.engines.base import Engine, EngineError

logger = logging.getLogger("harmony_proxy")


async def until_serving(engine: Engine, first_wait: float = 0.2, longest_wait: float = 5.0) -> None:
    """Return once the engine is ready and its health check passes (what /health asks). Each new reason it cannot
    serve is logged once; the checks back off from `first_wait` to `longest_wait` seconds."""
    wait, said = first_wait, ""
    while True:
        problem = await _problem(engine)
        if not problem:
            return
        if problem != said and engine.ready:  # not ready: still starting (a host connecting), nothing to say yet
            logger.warning("the %s engine cannot serve yet: %s (checking again until it can)", engine.name, problem)
            said = problem
        await asyncio.sleep(wait)
        wait = min(wait * 2, longest_wait)


async def _problem(engine: Engine) -> str:
    """'' when the engine serves, else why not."""
    if not engine.ready:
        return "starting"
    try:
        await engine.check_health()
    except EngineError as exc:
        return str(exc)
    return ""
