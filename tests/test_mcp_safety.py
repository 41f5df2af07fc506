"""MCP safety (issue 16 item 6): every URL the MCP client reaches passes --mcp-allow (redirects, SSE `endpoint`
events), and no secret the client sent is logged, echoed, stored or quoted, whatever its length and wherever it
was (headers, `authorization`, the `server_url` query). Real MCP servers on loopback (tests/mcp_servers.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.responses import RedirectResponse

from proxy.engines.scripted import scripted_engine
from proxy.server_tools.headers import ServerHeaders
from proxy.telemetry.access_log import redact_body
from tests.conftest import MODEL, LiveServer
from tests.mcp_servers import Record, Recording, weather_server
from tests.test_e2e_chat import client_for
from tests.test_mcp_loop import ANSWER, call

SECRET = "s3cr3t-header-value-0123456789"
SHORT = "k3y"  # a secret shorter than 8 characters
QUERY_TOKEN = "qtok-0123456789abcdef"


def redirecting(app: Any, source: str, target: str) -> Any:
    """`app`, with `source` answered by a same-origin 307 to `target`."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == source:
            await RedirectResponse(target, status_code=307)(scope, receive, send)
            return
        await app(scope, receive, send)

    return asgi


@pytest.fixture
def escape_by_redirect() -> Iterator[tuple[str, Record]]:
    """A server whose allowed-looking `/mcp/x` redirects to `/admin/mcp`, where a real MCP server answers."""
    record = Record()
    app = weather_server().streamable_http_app(streamable_http_path="/admin/mcp")
    live = LiveServer(Recording(redirecting(app, "/mcp/x", "/admin/mcp"), record)).start()
    try:
        yield live.base_url, record
    finally:
        live.stop()


@pytest.fixture
def escape_by_endpoint() -> Iterator[tuple[str, Record]]:
    """An SSE MCP server under `/mcp/sse` whose `endpoint` event sends messages to `/admin/messages/`."""
    record = Record()
    app = weather_server().sse_app(sse_path="/mcp/sse", message_path="/admin/messages/")
    live = LiveServer(Recording(app, record)).start()
    try:
        yield live.base_url, record
    finally:
        live.stop()


def outside(record: Record) -> list[str]:
    return [path for _, path, _ in record.requests if path.startswith("/admin")]


def test_a_redirect_out_of_the_allowed_prefix_is_not_followed(serve: Callable[..., LiveServer],
                                                              escape_by_redirect: tuple[str, Record]) -> None:
    base, record = escape_by_redirect
    server = serve(completions=[ANSWER], mcp_allow=(base + "/mcp",))
    reply = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "input": "x", "tools": [{"type": "mcp", "server_label": "w", "server_url": base + "/mcp/x",
                                                 "headers": {"Authorization": f"Bearer {SECRET}"}}]})
    assert reply.status_code == 424, reply.text
    assert "--mcp-allow" in reply.json()["error"]["message"] and SECRET not in reply.text
    assert outside(record) == []  # nothing, and no Authorization, was sent to /admin


def test_an_sse_endpoint_out_of_the_allowed_prefix_is_not_posted_to(serve: Callable[..., LiveServer],
                                                                    escape_by_endpoint: tuple[str, Record]) -> None:
    base, record = escape_by_endpoint
    server = serve(completions=[ANSWER], mcp_allow=(base + "/mcp",))
    reply = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "input": "x", "tools": [{"type": "mcp", "server_label": "w", "server_url": base + "/mcp/sse",
                                                 "headers": {"Authorization": f"Bearer {SECRET}"}}]})
    assert reply.status_code == 424, reply.text
    assert "--mcp-allow" in reply.json()["error"]["message"]
    assert [path for path in outside(record)] == []
    assert [path for _, path, _ in record.requests] == ["/mcp/sse"]  # the stream was opened, nothing else


def test_an_allowed_sse_server_still_works(serve: Callable[..., LiveServer], vocab: Any) -> None:
    record = Record()
    live = LiveServer(Recording(weather_server().sse_app(sse_path="/mcp/sse", message_path="/mcp/messages/"),
                                record)).start()
    try:
        engine = scripted_engine(vocab, [call("w.get_forecast", '{"city":"Paris"}'), ANSWER])
        server = serve(engine=engine, mcp_allow=(live.base_url + "/mcp",))
        response = client_for(server).responses.create(model=MODEL, input="x", tools=[
            {"type": "mcp", "server_label": "w", "server_url": live.base_url + "/mcp/sse",
             "require_approval": "never"}])
        assert response.output[2].output == "Paris: sunny, 21C"
    finally:
        live.stop()


def test_secrets_in_the_query_and_short_ones_are_never_logged_echoed_stored_or_quoted(
        serve: Callable[..., LiveServer], vocab: Any, weather: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    engine = scripted_engine(vocab, [call("weather.echo_authorization"), ANSWER])
    server = serve(engine=engine, mcp_allow=(weather.url,), log_requests=True)
    url = f"{weather.url}?token={QUERY_TOKEN}"
    response = client_for(server).responses.create(model=MODEL, input="Who am I?", tools=[
        {"type": "mcp", "server_label": "weather", "server_url": url, "headers": {"Authorization": SHORT},
         "require_approval": "never"}])
    assert response.output[2].output == "Authorization: [redacted]"  # the server quoted a 3-character secret
    assert QUERY_TOKEN not in response.tools[0].server_url and "token=" in response.tools[0].server_url
    stored = httpx.get(f"{server.base_url}/v1/responses/{response.id}", timeout=10).text
    assert QUERY_TOKEN not in stored and SHORT not in json.dumps(json.loads(stored)["output"])
    logged = "\n".join(record.getMessage() + str(getattr(record, "detail", "")) for record in caplog.records)
    assert "HTTP Request" in logged  # the HTTP client did log its requests ...
    assert QUERY_TOKEN not in logged  # ... without the token


def test_short_secrets_are_scrubbed_from_error_text() -> None:
    headers = ServerHeaders({"X-Key": SHORT, "Authorization": "Bearer ab"})
    scrubbed = headers.scrub(f"server said: bad key {SHORT}, token ab")
    assert scrubbed == "server said: bad key [redacted], token [redacted]"


@pytest.mark.parametrize("body", [
    # "tools" given twice: the first holds the secrets, the last is what a JSON reader keeps
    '{"model": "m", "tools": [{"type": "mcp", "headers": {"A": "%(s)s"}, "authorization": "%(s)s"}], "tools": []}',
    # tools as an object, not a list
    '{"model": "m", "tools": {"type": "mcp", "headers": {"A": "%(s)s"}, "authorization": "%(s)s"}}',
    # nested deeper, and a token in a server_url query
    '{"model": "m", "tools": [{"type": "mcp", "server_url": "https://mcp.example/mcp?key=%(s)s"}]}',
    '{"model": "m", "tools": [[{"headers": {"A": "%(s)s"}}]]}',
])
def test_logged_bodies_hold_no_secret_however_tools_is_written(body: str) -> None:
    cleaned = redact_body((body % {"s": SECRET}).encode())
    assert SECRET.encode() not in cleaned and json.loads(cleaned)["model"] == "m"
