"""Run one of the test MCP servers over stdio, as a client such as Codex starts a local MCP server:
`python -m tests.mcp_stdio weather`."""

from __future__ import annotations

import sys

from tests.mcp_servers import python_server, weather_server

SERVERS = {"weather": weather_server, "python": python_server}

if __name__ == "__main__":
    SERVERS[sys.argv[1]]().run("stdio")
