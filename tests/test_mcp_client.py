"""The MCP client against real MCP servers on loopback ports: listing, calls, failures, limits, transports,
cancellation, the tool-list cache, the `--tool-server` registry, and headers that reach servers but never logs."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from proxy.server_tools.builtin import BROWSER, BROWSER_FUNCTIONS, PYTHON, ToolServers
from proxy.server_tools.connect import McpServerError
from proxy.server_tools.headers import REDACTED, ServerHeaders
from proxy.server_tools.limits import McpLimits
from proxy.server_tools.output import truncated_marker
from proxy.server_tools.sessions import McpSessions
from proxy.server_tools.tool_cache import ToolListCache
from proxy.server_tools.transport import SSE, STREAMABLE_HTTP
from tests.conftest import LiveServer
from tests.mcp_servers import (
    Record,
    Running,
    browser_server,
    python_server,
    serving,
    trouble_server,
    unstarted,
    weather_server,
)

SECRET = "Bearer s3cr3t-token-0123456789"
LIMITS = McpLimits(connect_timeout=10, list_timeout=10, call_timeout=10)


def run(coroutine):
    return asyncio.run(coroutine)


def test_lists_a_servers_tools_name_and_instructions(weather: Running) -> None:
    async def scenario():
        async with McpSessions(LIMITS) as sessions:
            session = await sessions.get(weather.url)
            return session.transport, await session.list_tools()

    transport, listed = run(scenario())
    assert transport == STREAMABLE_HTTP
    assert (listed.server_name, listed.instructions) == ("weather", "Weather forecasts for cities.")
    forecast = listed.get("get_forecast")
    assert [tool.name for tool in listed.tools] == ["get_forecast", "echo_authorization"]
    assert forecast is not None and forecast.description == "Get the weather forecast for a city."
    assert forecast.input_schema["properties"]["city"]["type"] == "string"
    assert forecast.input_schema["required"] == ["city"]
    assert listed.only(["echo_authorization"]).tools == (listed.tools[1],)


def test_a_call_returns_the_tools_text(weather: Running) -> None:
    async def scenario():
        async with McpSessions(LIMITS) as sessions:
            session = await sessions.get(weather.url)
            return (await session.call_tool("get_forecast", {"city": "Paris", "days": 3}),
                    await session.call_tool_json("get_forecast", '{"city": "Rome"}'),
                    await session.call_tool_json("get_forecast", "[1, 2]"))

    called, from_json, not_an_object = run(scenario())
    assert (called.text, called.failed, called.truncated) == ("Paris: sunny, 21C for 3 days", False, False)
    assert from_json.text == "Rome: sunny, 21C" and from_json.error is None
    assert not_an_object.failed and "must be a JSON object" in not_an_object.text


def test_sse_is_used_for_an_sse_url(weather_sse: Running) -> None:
    async def scenario():
        async with McpSessions(LIMITS) as sessions:
            session = await sessions.get(weather_sse.url)
            return (session.transport, await session.list_tools(),
                    await session.call_tool("get_forecast", {"city": "Oslo"}))

    transport, listed, called = run(scenario())
    assert weather_sse.url.endswith("/sse") and transport == SSE
    assert listed.server_name == "weather" and called.text == "Oslo: sunny, 21C"
    assert "POST" not in [method for method, path, _ in weather_sse.record.requests if path == "/sse"]


def test_a_server_without_streamable_http_is_reached_over_sse() -> None:
    # The SSE endpoint is at /events: nothing in the URL says SSE; the POST is answered 405 and SSE is tried.
    with serving(weather_server(), transport="sse", path="/events") as running:
        async def scenario():
            async with McpSessions(LIMITS) as sessions:
                session = await sessions.get(running.url)
                return session.transport, await session.call_tool("get_forecast", {"city": "Lima"})

        transport, called = run(scenario())
        assert transport == SSE and called.text == "Lima: sunny, 21C"
        methods = running.record.methods()
        assert methods[0] == "POST" and "GET" in methods  # streamable HTTP first, then the SSE stream


def test_a_failing_tool_is_a_failed_output_not_an_exception(trouble: Running) -> None:
    async def scenario():
        async with McpSessions(LIMITS) as sessions:
            session = await sessions.get(trouble.url)
            return await session.call_tool("fail", {}), await session.call_tool("no_such_tool", {})

    failed, unknown = run(scenario())
    assert failed.failed and failed.error == failed.text and "fail" in failed.text
    assert unknown.failed and "no_such_tool" in unknown.text


def test_a_call_past_its_timeout_fails_and_is_cancelled_on_the_server(trouble: Running) -> None:
    async def scenario():
        async with McpSessions(LIMITS) as sessions:
            session = await sessions.get(trouble.url)
            started = time.monotonic()
            output = await session.call_tool("hang", {}, timeout=0.5)
            return output, time.monotonic() - started, await session.call_tool("large", {"chars": 5})

    trouble.record.events.clear()
    output, elapsed, afterwards = run(scenario())
    assert output.failed and "timed out after 0.5 seconds" in output.text
    assert elapsed >= 0.5  # ended by its timeout (the tool hangs for ever), not before
    assert trouble.record.wait_for("hang cancelled")
    assert afterwards.text == "lorem"  # the session is still usable


def test_output_past_the_limit_is_cut_with_a_marker(trouble: Running) -> None:
    async def scenario():
        async with McpSessions(McpLimits(max_output_chars=1000)) as sessions:
            session = await sessions.get(trouble.url)
            return (await session.call_tool("large", {"chars": 50_000}),
                    await session.call_tool("large", {"chars": 1000}))

    cut, whole = run(scenario())
    assert cut.truncated and not cut.failed
    assert cut.text == ("lorem ipsum " * 100)[:1000] + truncated_marker(50_000, 1000)
    assert not whole.truncated and len(whole.text) == 1000


@pytest.mark.parametrize("legacy", [False, True], ids=["modern", "handshake-era"])
def test_cancelling_the_response_task_cancels_the_call_and_closes_the_session(legacy: bool) -> None:
    record = Record()
    with serving(trouble_server(record), record=record, legacy=legacy) as trouble:
        async def scenario():
            started = asyncio.Event()
            opened = []

            async def response() -> None:
                async with McpSessions(LIMITS) as sessions:
                    opened.append(await sessions.get(trouble.url))
                    started.set()
                    await opened[0].call_tool("hang", {})

            task = asyncio.create_task(response())
            await started.wait()
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await opened[0].call_tool("large", {"chars": 5})

        afterwards = run(scenario())
        assert record.wait_for("hang cancelled")
        assert afterwards.failed  # the session is closed
        # A handshake-era session has an id, which closing ends on the server; a modern one has no state to end.
        assert ("DELETE" in record.methods()) is legacy


def test_headers_reach_the_server_but_never_logs_reprs_or_outputs(weather: Running,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    headers = ServerHeaders.from_request({"Authorization": SECRET, "X-Tenant": "blue"})

    async def scenario():
        async with McpSessions(LIMITS) as sessions:
            session = await sessions.get(weather.url, headers)
            await session.list_tools()
            echoed = await session.call_tool("echo_authorization", {})
            try:
                await sessions.get("http://127.0.0.1:9/mcp", headers)
            except McpServerError as exc:
                return echoed, str(exc)
        raise AssertionError("a closed port was reached")

    weather.record.requests.clear()
    with caplog.at_level(logging.DEBUG):
        echoed, refused = run(scenario())
    assert set(weather.record.header_values("Authorization")) == {SECRET}
    assert set(weather.record.header_values("X-Tenant")) == {"blue"}
    assert echoed.text == f"Authorization: {REDACTED}"
    assert "127.0.0.1:9" in refused and "s3cr3t" not in refused
    assert caplog.records and "s3cr3t" not in caplog.text
    assert "s3cr3t" not in repr(headers) + str(headers) + repr(headers.redacted())
    assert headers.redacted() == {"Authorization": REDACTED, "X-Tenant": REDACTED}


def test_unreachable_and_refusing_servers_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def refuse(request):
        return PlainTextResponse("no", status_code=401)

    live = LiveServer(Starlette(routes=[Route("/mcp", refuse, methods=["GET", "POST", "DELETE"])])).start()
    try:
        async def scenario() -> list[str]:
            messages = []
            async with McpSessions(LIMITS) as sessions:
                for url in ("http://127.0.0.1:9/mcp", live.base_url + "/mcp", live.base_url + "/mcp"):
                    try:
                        await sessions.get(url)
                    except McpServerError as exc:
                        messages.append(str(exc))
            return messages

        closed, unauthorized, again = run(scenario())
    finally:
        live.stop()
    assert closed.startswith("Could not connect to the MCP server at http://127.0.0.1:9/mcp")
    assert unauthorized.startswith(f"Could not connect to the MCP server at {live.base_url}/mcp:")
    assert again == unauthorized  # remembered: the response does not try a failed server again


def test_cancelling_while_connecting_stops_connecting() -> None:
    async def silent(request):
        await asyncio.sleep(30)
        return PlainTextResponse("too late")

    live = LiveServer(Starlette(routes=[Route("/mcp", silent, methods=["GET", "POST", "DELETE"])])).start()

    async def scenario() -> float:
        async with McpSessions(LIMITS) as sessions:
            task = asyncio.create_task(sessions.get(live.base_url + "/mcp"))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            elapsed = time.monotonic() - started
            await asyncio.sleep(0.05)
            assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("MCP session")]
            return elapsed

    try:
        assert run(scenario()) < 1
    finally:
        live._server.force_exit = True
        live.stop()


def test_one_session_per_url_and_headers_from_any_task(weather: Running) -> None:
    async def scenario() -> None:
        async with McpSessions(LIMITS) as sessions:
            first, second = await asyncio.gather(sessions.get(weather.url), sessions.get(weather.url))
            assert first is second and sessions.opened == 1
            assert await asyncio.create_task(sessions.get(weather.url)) is first
            assert await sessions.get(weather.url, ServerHeaders({"Authorization": SECRET})) is not first
            assert sessions.opened == 2
        assert sessions.opened == 0 and not first.connected
        assert (await first.call_tool("get_forecast", {"city": "Oslo"})).failed  # closed

    run(scenario())


@pytest.mark.parametrize("legacy", [False, True], ids=["modern", "handshake-era"])
def test_a_server_that_goes_away_fails_calls_but_never_the_response(legacy: bool) -> None:
    async def scenario(running: Running):
        async with McpSessions(McpLimits(call_timeout=600)) as sessions:
            session = await sessions.get(running.url)
            before = await session.call_tool("get_forecast", {"city": "Oslo"})
            running.kill()
            started = time.monotonic()
            after = await session.call_tool("get_forecast", {"city": "Oslo"})
            return before, after, time.monotonic() - started, await asyncio.sleep(0, "still running")

    with serving(weather_server(), legacy=legacy) as running:
        before, after, elapsed, still = run(scenario(running))
    assert not before.failed and after.failed and still == "still running"
    # the lost connection fails the call; the timeout (600 s) is not what ends it
    assert "timed out" not in after.text and elapsed < 600, after.text


def test_the_tool_list_cache_spares_relisting_until_it_expires(weather: Running) -> None:
    now = [0.0]
    cache = ToolListCache(max_entries=2, ttl_seconds=60, clock=lambda: now[0])
    token = ServerHeaders({"Authorization": SECRET})

    async def listing(headers: ServerHeaders, allowed: list[str] | None):
        async with McpSessions(LIMITS) as sessions:
            return await cache.list_tools(sessions, weather.url, headers, allowed)

    first, cached = run(listing(token, None))
    assert not cached and len(first.tools) == 2
    again, cached = run(listing(ServerHeaders({"Authorization": SECRET}), None))
    assert cached and again is first
    assert run(listing(ServerHeaders({"Authorization": SECRET + "x"}), None))[1] is False  # other headers
    only, cached = run(listing(token, ["get_forecast"]))  # another filter: listed anew, filtered
    assert not cached and [tool.name for tool in only.tools] == ["get_forecast"]
    assert len(cache) == 2  # the least recently used of three went
    assert cache.get(weather.url, token, None) is None
    now[0] = 61.0
    assert run(listing(token, ["get_forecast"]))[1] is False  # expired


def test_tool_servers_provide_the_browser_and_python_and_retry_late_ones() -> None:
    now = [0.0]
    url, start = unstarted(python_server())
    with serving(browser_server()) as browser:
        servers = ToolServers([browser.url, url], LIMITS, retry_seconds=30, clock=lambda: now[0])
        tools = run(servers.builtin_tools())
        assert set(tools) == {BROWSER}
        assert (tools[BROWSER].url, tools[BROWSER].functions) == (browser.url, BROWSER_FUNCTIONS)
        live = start()
        try:
            assert set(run(servers.builtin_tools())) == {BROWSER}  # not retried before retry_seconds
            now[0] = 30.0
            tools = run(servers.builtin_tools())
            assert tools[PYTHON].url == url and tools[PYTHON].functions == ("python",)

            async def calls():
                async with McpSessions(LIMITS) as sessions:
                    web = await sessions.get(tools[BROWSER].url)
                    python = await sessions.get(tools[PYTHON].url)
                    return (await web.call_tool_json(tools[BROWSER].server_tool("browser.find"), '{"pattern": "rain"}'),
                            await python.call_tool(tools[PYTHON].server_tool("python"),
                                                   {tools[PYTHON].code_argument: "print(6 * 7)"}))

            found, printed = run(calls())
            assert "Rain on Sunday." in found.text and printed.text == "42\n"
        finally:
            live.stop()
