"""A WebSocket connection's side of steering (proxy/responses/steering.py): the responses generating on it, the
steers sent to them, and the `response.steer.*` events, each numbered in the stream of the response it is about."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.responses import steering
from proxy.responses.run import ResponseRun
from proxy.responses.transport.frames import EventWriter

Successor = tuple[dict[str, Any], list[steering.Steer]]  # a steered response's successor: its create, its steers


@dataclass
class Running:
    """A response generating on the connection: what a steer needs to reach it."""

    run: ResponseRun
    body: dict[str, Any]  # its create, as sent: a successor's settings
    writer: EventWriter  # numbers its events
    stream_id: str | None
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)  # its events go out in the order they are numbered


class ConnectionSteering:
    def __init__(self, send: Callable[[str], Awaitable[None]], finished: Callable[[str], bool]) -> None:
        """`send` writes a message to the client (quietly, if it left); `finished(id)`: a response of this
        connection that ended."""
        self._send = send
        self._finished = finished
        self._running: dict[str, Running] = {}
        self._steers = steering.Steers()

    def held_input(self, body: dict[str, Any]) -> dict[str, Any]:
        """A create with the steers held for the response it continues first in its input."""
        return self._steers.held_input(body)

    def started(self, run: ResponseRun, body: dict[str, Any], writer: EventWriter, stream_id: str | None) -> Running:
        running = self._running[run.id] = Running(run, body, writer, stream_id)
        return running

    async def steer(self, data: dict[str, Any]) -> None:
        """A `response.steer` event: queued for its response (`accepted`), or `failed`."""
        target, running = data.get("previous_response_id"), None
        try:
            steer = steering.read_steer(data)
            running = self._running.get(steer.target)
            if running is None:
                raise steering.SteerError(
                    "response_already_completed" if self._finished(steer.target) else "response_not_found",
                    f"No response {steer.target!r} is generating on this connection.")
            problem = steering.refusal(running.body)
            if problem is not None:
                raise problem
            self._steers.queue(steer)
        except steering.SteerError as exc:
            await self._event(steering.failed(exc, target, data.get("input")), running)
            return
        running.run.steer()
        await self._event(steering.accepted(steer), running)

    async def finished(self, running: Running, resource: dict[str, Any]) -> Successor | None:
        """A response ended (its terminal event sent): the successor its steers make, or the steers held for the
        tool output it waits for (`response.steer.pending`), or failed."""
        run = running.run
        del self._running[run.id]
        steers = self._steers.take(run.id)
        if not steers:
            return None
        if resource["status"] not in ("completed", "incomplete"):
            await self.fail(steers, "response_not_active", "The response did not complete.", running.stream_id)
            return None
        required = steering.required_input(resource["output"]) if not run.steered else []
        if not required:
            return steering.successor(running.body, run.id, steers), steers
        dropped = self._steers.hold(run.id, steers)
        for steer in steers:
            await self._event(steering.pending(steer, required), running)
        await self.fail(dropped, "response_not_active", "Too many responses hold steers on this connection.",
                        running.stream_id)
        return None

    async def stopped(self, response_id: str, stream_id: str | None) -> None:
        """A response that ended otherwise (cancelled, failed to send): its steers fail."""
        if self._running.pop(response_id, None) is not None:
            await self.fail(self._steers.take(response_id), "response_not_active",
                            "The response ended before the steer could be applied.", stream_id)

    async def fail(self, steers: list[steering.Steer], code: str, message: str, stream_id: str | None) -> None:
        for steer in steers:
            await self._event(steering.failed(steering.SteerError(code, message), steer.target, steer.input,
                                              steer.id), None, stream_id)

    async def _event(self, event: dict[str, Any], running: Running | None, stream_id: str | None = None) -> None:
        """An event numbered in its response's stream, after the events sent before it; else alone."""
        if running is None:
            for message in EventWriter().messages([event], stream_id):
                await self._send(message)
            return
        async with running.sending:
            for message in running.writer.messages([event], running.stream_id):
                await self._send(message)
