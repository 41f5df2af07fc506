"""Real MCP servers for the tests: the `mcp` SDK's MCPServer (FastMCP in mcp 1.x) under uvicorn, in a thread, on
a loopback port, over streamable HTTP (`/mcp`) or HTTP+SSE (`/sse`).

- `weather_server`: `get_forecast(city, days?)`, and `echo_authorization`, which returns the header it was sent;
- `trouble_server`: `fail` (raises), `hang` (sleeps until cancelled; the record notes both), `large(chars)`;
- `browser_server`: gpt-oss's browser (`search`, `open`, `find`, as gpt-oss-mcp-server/browser_server.py declares
  them) over two canned pages;
- `python_server`: gpt-oss's `python` tool answering canned output; it never executes code.

`serving(server)` runs one and gives its URL and a `Record` of what it saw: every HTTP request's method, path
and headers, and events the tools note.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from starlette.responses import JSONResponse

from tests.conftest import LiveServer

BROWSER_INSTRUCTIONS = """Tool for browsing.
The `cursor` appears in brackets before each browsing display: `[{cursor}]`.
Cite information from the tool using the following format:
`【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.
Do not quote more than 10 words directly from the tool output.
sources=web"""
PAGES = {
    "https://weather.example/paris": ("Paris forecast",
                                      "Paris: sunny, 21C.\nWind light from the west.\nRain on Sunday."),
    "https://weather.example/rome": ("Rome forecast", "Rome: cloudy, 25C.\nThunderstorms possible in the evening."),
}
CANNED_PYTHON = {"print(6 * 7)": "42\n"}


@dataclass
class Record:
    """What a test server saw; appended to by the server's thread, read by the test's."""

    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # method, path, headers
    events: list[str] = field(default_factory=list)

    def header_values(self, name: str) -> list[str]:
        return [headers[name.lower()] for _, _, headers in self.requests if name.lower() in headers]

    def methods(self) -> list[str]:
        return [method for method, _, _ in self.requests]

    def wait_for(self, event: str) -> bool:
        """True once `event` was recorded, waited for as long as it takes (pytest-timeout catches a hang)."""
        while event not in self.events:
            time.sleep(0.01)
        return True


class Recording:
    """ASGI middleware noting each HTTP request in a Record before the MCP app serves it. With `legacy`, it
    answers `server/discover` as a server of the handshake era (mcp 1.x, gpt-oss's own servers) does: method not
    found, so clients fall back to `initialize` and a session with an `Mcp-Session-Id`."""

    def __init__(self, app: Any, record: Record, legacy: bool = False) -> None:
        self.app = app
        self.record = record
        self.legacy = legacy

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "http":
            headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
            self.record.requests.append((scope["method"], scope["path"], headers))
            if self.legacy and scope["method"] == "POST":
                body, receive = await _read_body(receive)
                message = json.loads(body or b"null")
                if isinstance(message, dict) and message.get("method") == "server/discover":
                    error = {"jsonrpc": "2.0", "id": message.get("id"),
                             "error": {"code": -32601, "message": "Method not found"}}
                    await JSONResponse(error)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


async def _read_body(receive: Callable[..., Any]) -> tuple[bytes, Callable[..., Any]]:
    """The request body, and a `receive` that hands it to the app again."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def weather_server() -> MCPServer:
    server = MCPServer(name="weather", instructions="Weather forecasts for cities.", log_level="WARNING")

    @server.tool(name="get_forecast", description="Get the weather forecast for a city.")
    async def get_forecast(city: str, days: int | None = None) -> str:
        return f"{city}: sunny, 21C" + (f" for {days} days" if days else "")

    @server.tool(name="echo_authorization", description="Say which Authorization header the request carried.")
    async def echo_authorization(ctx: Context) -> str:
        return f"Authorization: {(ctx.headers or {}).get('authorization')}"

    return server


def trouble_server(record: Record) -> MCPServer:
    server = MCPServer(name="trouble", log_level="WARNING")

    @server.tool(name="fail", description="Always fails.")
    async def fail() -> str:
        raise RuntimeError("the failing tool failed, as it always does")

    @server.tool(name="hang", description="Never answers.")
    async def hang() -> str:
        record.events.append("hang started")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            record.events.append("hang cancelled")
            raise
        return "unreachable"

    @server.tool(name="large", description="Answers with `chars` characters.")
    async def large(chars: int) -> str:
        return ("lorem ipsum " * (chars // 12 + 1))[:chars]

    return server


def browser_server() -> MCPServer:
    server = MCPServer(name="browser", instructions=BROWSER_INSTRUCTIONS, log_level="WARNING")

    @server.tool(name="search", description="Searches for information related to `query` and displays `topn` results.")
    async def search(query: str, topn: int = 10, source: str | None = None) -> str:
        lines = [f"L{i}: 【{i}†{title}†{url.split('/')[2]}】" for i, (url, (title, _)) in enumerate(PAGES.items())]
        return f"[0] Search results for `{query}`\n**viewing lines [0 - {len(lines) - 1}]**\n\n" + "\n".join(lines)

    @server.tool(name="open", description="Opens the link `id` from the page indicated by `cursor`.")
    async def open_link(id: int | str = -1, cursor: int = -1, loc: int = -1, num_lines: int = -1,
                        view_source: bool = False, source: str | None = None) -> str:
        url = id if isinstance(id, str) else list(PAGES)[max(id, 0) % len(PAGES)]
        title, text = PAGES.get(url, ("Not found", "No such page."))
        body = "\n".join(f"L{i}: {line}" for i, line in enumerate(text.split("\n")))
        return f"[1] {title} ({url})\n**viewing lines [0 - {text.count(chr(10))}]**\n\n{body}"

    @server.tool(name="find", description="Finds exact matches of `pattern` in the current page.")
    async def find(pattern: str, cursor: int = -1) -> str:
        hits = [line for _, text in PAGES.values() for line in text.split("\n") if pattern.lower() in line.lower()]
        return f"[2] Find results for `{pattern}`\n\n" + ("\n".join(hits) or f"No `find` results for `{pattern}`")

    return server


def python_server() -> MCPServer:
    server = MCPServer(name="python", instructions="Runs Python (canned: nothing is executed).", log_level="WARNING")

    @server.tool(name="python", description="Execute Python code (here: canned output, nothing runs).")
    async def python(code: str) -> str:
        return CANNED_PYTHON.get(code.strip(), f"(canned) received {len(code)} characters of code\n")

    return server


@dataclass
class Running:
    url: str
    record: Record
    live: LiveServer

    def kill(self) -> None:
        """Stop serving at once, open connections or not, as a server that crashes."""
        self.live._server.force_exit = True  # uvicorn: do not wait for open streams to end
        self.live.stop()


@contextmanager
def serving(server: MCPServer, transport: str = "streamable-http", path: str | None = None,
            record: Record | None = None, legacy: bool = False) -> Iterator[Running]:
    """Serve `server` on a loopback port; `path` is where (default `/mcp`, or `/sse` for transport "sse");
    `legacy` makes it speak only the handshake-era protocol (see Recording)."""
    record = record if record is not None else Record()
    if transport == "sse":
        path = path or "/sse"
        app = server.sse_app(sse_path=path)
    else:
        path = path or "/mcp"
        app = server.streamable_http_app(streamable_http_path=path)
    live = LiveServer(Recording(app, record, legacy)).start()
    try:
        yield Running(live.base_url + path, record, live)
    finally:
        live.stop()


def unstarted(server: MCPServer, record: Record | None = None) -> tuple[str, Callable[[], LiveServer]]:
    """A streamable HTTP URL whose port is reserved but not served yet, and the function that starts serving it."""
    live = LiveServer(Recording(server.streamable_http_app(), record or Record()))
    return live.base_url + "/mcp", live.start


# Module-scoped servers for the tests that talk MCP (made available to every test module by tests/conftest.py).


@pytest.fixture(scope="module")
def weather() -> Iterator[Running]:
    with serving(weather_server()) as running:
        yield running


@pytest.fixture(scope="module")
def weather_sse() -> Iterator[Running]:
    with serving(weather_server(), transport="sse") as running:
        yield running


@pytest.fixture(scope="module")
def trouble() -> Iterator[Running]:
    record = Record()
    with serving(trouble_server(record), record=record) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Running]:
    with serving(browser_server()) as running:
        yield running


@pytest.fixture(scope="module")
def python() -> Iterator[Running]:
    with serving(python_server(), transport="sse") as running:
        yield running
