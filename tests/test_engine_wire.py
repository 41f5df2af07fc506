"""The engine host's wire (proxy/engines/wire.py) carries data only: a request crosses as JSON fields and packed
token ids and comes back equal; a pickle sent to the host is refused and runs nothing (issue 26, item 6: the
pattern of vLLM's and SGLang's remote-code-execution advisories)."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
from pathlib import Path

import pytest

from proxy.engines import wire
from proxy.engines.base import GenerationRequest, OutputConstraint, SamplingParams
from tests.test_engine_host import SharedHost, collect, remote, request, shared_host  # noqa: F401  # a fixture
from tests.waiting import eventually
from tools.definitions import FunctionTool, ResponseFormat, ToolChoice
from tools.freeform import Freeform

RICH = GenerationRequest(
    "resp_1", [200006, 17360, 0, 4294967295],
    SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop_token_ids=(200002, 200012), min_tokens=1,
                   ignore_eos=False),
    OutputConstraint(
        (FunctionTool("get_weather", "Weather.", {"type": "object", "properties": {"city": {"type": "string"}}},
                      True, "tools"),
         FunctionTool("patch", freeform=Freeform("lark", 'start: "a"+'))),
        ToolChoice("function", "get_weather"),
        ResponseFormat("answer", {"type": "object"}, "An answer.", True),
        parallel_tool_calls=False,
    ),
    routing_hints=("resp_0", "cache-key"),
    trace_headers=(("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),),
)


def read_back(data: bytes) -> GenerationRequest:
    found: list[GenerationRequest] = []

    def handler(kind: int, handle: int, payload: bytes, start: int, end: int) -> None:
        assert (kind, handle) == (wire.SUBMIT, 9)
        found.append(wire.read_request(payload[start:end]))

    wire.FrameReader(handler).feed(data)
    return found[0]


def test_a_request_crosses_the_wire_unchanged() -> None:
    assert read_back(wire.request_frame(9, RICH)) == RICH
    plain = GenerationRequest("r", [1, 2, 3], SamplingParams(max_tokens=1))
    assert read_back(wire.request_frame(9, plain)) == plain


class RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload", [b"", b"\x05\x00\x00\x00{}", b"\xff\xff\xff\x7f", b"\x02\x00\x00\x00{}\x01",
                                     pickle.dumps(RICH)])
def test_anything_but_a_request_is_a_protocol_error(payload: bytes) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.read_request(payload)


def test_a_pickle_sent_to_the_host_is_refused_and_runs_nothing(shared_host: SharedHost,  # noqa: F811
                                                                tmp_path: Path) -> None:
    _, path, host_alive = shared_host
    marker = tmp_path / "pwned"
    exploit = pickle.dumps(RunsACommand(marker))
    assert not marker.exists()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        def connected() -> bool:
            try:
                client.connect(str(path))
            except (FileNotFoundError, ConnectionRefusedError):
                return False
            return True

        # The host binds its socket once the engine is loaded; a host that never answers is pytest-timeout's.
        eventually(connected, still=host_alive, interval=0.05, why="the engine host ended before it listened")
        length, _, kind = wire.HEADER.unpack(client.recv(wire.HEADER.size, socket.MSG_WAITALL))
        assert kind == wire.HELLO
        client.recv(length, socket.MSG_WAITALL)
        client.sendall(wire.frame(wire.SUBMIT, 1, exploit))
        closed = b""
        while chunk := client.recv(65536):  # the host closes the connection of a peer that breaks the protocol
            closed += chunk
    assert not marker.exists()

    async def served() -> int:  # and it goes on serving every other front end
        async with remote(path, host_alive) as engine:
            return len(await collect(engine.generate(request(31, max_tokens=3))))

    assert asyncio.run(served()) >= 1
