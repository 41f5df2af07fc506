"""The `--mcp-allow` policy: a client's MCP server_url is allowed only under a prefix the operator named."""

from __future__ import annotations

import re

import pytest

from proxy.server.arguments import StartupError, build_parser
from proxy.server.startup import server_config
from proxy.server_tools.allow import McpAllowList, McpUrlRefused

PREFIXES = ["http://allowed.example/mcp", "https://Straße.example", "http://[::1]:8000/tools/",
            "http://127.0.0.1:9000", "https://api.example:8443/v1/mcp/"]


@pytest.fixture(scope="module")
def allow() -> McpAllowList:
    return McpAllowList(PREFIXES)


@pytest.mark.parametrize(("url", "normalized"), [
    ("http://allowed.example/mcp", "http://allowed.example/mcp"),
    ("http://allowed.example/mcp/", "http://allowed.example/mcp/"),
    ("http://allowed.example/mcp/sub/sse", "http://allowed.example/mcp/sub/sse"),
    ("http://allowed.example:80/mcp", "http://allowed.example/mcp"),  # the default port, explicit
    ("HTTP://ALLOWED.Example/mcp", "http://allowed.example/mcp"),  # hosts and schemes are case-insensitive
    ("http://allowed.example./mcp", "http://allowed.example./mcp"),  # the same host, fully qualified
    ("http://allowed.example/mcp?key=1", "http://allowed.example/mcp?key=1"),  # a query is no part of the match
    ("http://allowed.example/other/../mcp/x", "http://allowed.example/mcp/x"),  # dot segments resolved first
    ("https://xn--strae-oqa.example/any/path", "https://xn--strae-oqa.example/any/path"),  # IDNA of the prefix
    ("https://STRASSE.example/x".replace("SS", "ß"), "https://xn--strae-oqa.example/x"),
    ("http://[0:0::1]:8000/tools/x", "http://[0:0::1]:8000/tools/x"),  # another spelling of ::1
    ("http://[::1]:8000/tools", "http://[::1]:8000/tools"),  # the prefix's folder itself
    ("https://api.example:8443/v1/mcp", "https://api.example:8443/v1/mcp"),
    ("http://127.0.0.1:9000/anything", "http://127.0.0.1:9000/anything"),
    ("https://api.example:8443/v1/mcp/x", "https://api.example:8443/v1/mcp/x"),
])
def test_urls_under_a_prefix_are_allowed(allow: McpAllowList, url: str, normalized: str) -> None:
    assert allow.check(url) == normalized


@pytest.mark.parametrize(("url", "rule"), [
    ("http://allowed.example@evil.example/mcp", "user name or password"),  # userinfo: the host is evil
    ("http://user:pw@allowed.example/mcp", "user name or password"),
    ("http://allowed.example/mcpx", "under no --mcp-allow prefix"),  # not at a segment boundary
    ("http://allowed.example/mc", "under no --mcp-allow prefix"),
    ("http://allowed.example/", "under no --mcp-allow prefix"),
    ("http://allowed.example/mcp/../admin", "under no --mcp-allow prefix"),  # resolves outside the prefix
    ("http://allowed.example/mcp/%2e%2e/admin", "percent-encode"),  # a server may decode it outside
    ("http://allowed.example/mcp%2fx", "percent-encode"),
    ("http://allowed.example:8080/mcp", "under no --mcp-allow prefix"),  # another port
    ("https://allowed.example/mcp", "under no --mcp-allow prefix"),  # another scheme (and port)
    ("http://allowed.example:443/mcp", "under no --mcp-allow prefix"),
    ("http://allowed.example.evil.example/mcp", "under no --mcp-allow prefix"),
    ("http://evil.example/allowed.example/mcp", "under no --mcp-allow prefix"),
    ("http://evil.example#@allowed.example/mcp", "under no --mcp-allow prefix"),  # the fragment hides nothing
    ("http://evil.example?@allowed.example/mcp", "under no --mcp-allow prefix"),
    ("http://allowed.example\\@evil.example/mcp", "backslashes"),
    ("http://allowed.example /mcp", "whitespace"),
    ("http://allowed.example/mcp\n", "whitespace"),
    ("http://allowed.example../mcp", "DNS name or an IP address"),
    ("http://allowed%2eexample/mcp", "DNS name or an IP address"),
    ("https://strasse.example/", "under no --mcp-allow prefix"),  # not the IDNA 2008 form of Straße
    ("http://[::2]:8000/tools/x", "under no --mcp-allow prefix"),
    ("http://[::1]:8000/toolsx", "under no --mcp-allow prefix"),
    ("http://127.0.0.1/anything", "under no --mcp-allow prefix"),  # the default port is not 9000
    ("http://2130706433:9000/", "under no --mcp-allow prefix"),  # 127.0.0.1 as a number: no match, refused
    ("http://localhost:9000/", "under no --mcp-allow prefix"),
    ("ftp://allowed.example/mcp", "http:// or https://"),
    ("file:///etc/passwd", "http:// or https://"),
    ("//allowed.example/mcp", "http:// or https://"),
    ("", "non-empty string"),
    (None, "non-empty string"),
    ("http://[::1/mcp", "not a valid URL"),
])
def test_urls_outside_every_prefix_are_refused_naming_the_rule(allow: McpAllowList, url: object, rule: str) -> None:
    with pytest.raises(McpUrlRefused, match=re.escape(rule)):
        allow.check(url)


def test_the_refusal_never_echoes_credentials_or_query(allow: McpAllowList) -> None:
    with pytest.raises(McpUrlRefused) as refused:
        allow.check("http://evil.example/mcp?token=s3cr3t")
    assert "evil.example/mcp" in str(refused.value) and "s3cr3t" not in str(refused.value)
    with pytest.raises(McpUrlRefused) as refused:
        allow.check("http://alice:s3cr3t@allowed.example/mcp")
    assert "s3cr3t" not in str(refused.value)


def test_without_an_allow_list_every_url_is_refused_naming_the_flag() -> None:
    with pytest.raises(McpUrlRefused, match="allows with --mcp-allow URL-PREFIX, and it allows none"):
        McpAllowList().check("http://127.0.0.1:8000/mcp")
    assert not McpAllowList()


@pytest.mark.parametrize(("prefix", "problem"), [
    ("allowed.example/mcp", "http:// or https://"),
    ("http://user@allowed.example/mcp", "user name or password"),
    ("http://allowed.example/mcp?x=1", "no query or fragment"),
    ("http://allowed.example/mcp#x", "no query or fragment"),
])
def test_bad_prefixes_stop_the_server_at_start_up(prefix: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        McpAllowList([prefix])


def test_a_root_prefix_allows_the_whole_origin() -> None:
    allow = McpAllowList(["http://tools.internal:8001/"])
    assert allow.check("http://tools.internal:8001/sse") == "http://tools.internal:8001/sse"
    with pytest.raises(McpUrlRefused):
        allow.check("http://tools.internal:8002/sse")


def test_the_flags_reach_the_server_config() -> None:
    args = build_parser().parse_args(["serve", "--mcp-allow", "http://a.example/mcp", "--mcp-allow",
                                      "https://b.example", "--tool-server", "http://127.0.0.1:8001/sse"])
    config = server_config(args, "mock")
    assert config.mcp_allow == ("http://a.example/mcp", "https://b.example")
    assert config.tool_servers == ("http://127.0.0.1:8001/sse",)
    with pytest.raises(StartupError, match="--mcp-allow 'a.example'"):
        server_config(build_parser().parse_args(["serve", "--mcp-allow", "a.example"]), "mock")
    with pytest.raises(StartupError, match="--tool-server"):
        server_config(build_parser().parse_args(["serve", "--tool-server", "ftp://x/"]), "mock")
