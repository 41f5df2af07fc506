"""Tools the server runs itself within one response: remote MCP tools and gpt-oss's built-in browser and python.

- `allow`: which MCP server URLs a client may name (`--mcp-allow`), the SSRF guard;
- `headers`: the headers a client sends to an MCP server, kept secret (redacted, scrubbed, hashed with a key);
- `transport`, `connect`: streamable HTTP or SSE, connecting the `mcp` SDK's Client, safe failure messages;
- `session`, `sessions`: one MCP session (list, call, close) and the sessions of one response;
- `listing`, `output`, `limits`: what a server offers, what a call returns, and the limits on both;
- `tool_cache`: tool lists reused across the responses of a chain;
- `builtin`: the `--tool-server`s and which of gpt-oss's built-in tools (browser, python) they provide;
- `rendering`: the Harmony text the tool loop adds to a prompt (namespaces, calls, results).
"""
