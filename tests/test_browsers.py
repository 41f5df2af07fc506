"""What a web page can make a browser send is refused unless allowed: cross-site simple requests (CSRF), DNS
rebinding, foreign origins; allowed origins get CORS (proxy/browsers.py), against the real server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets

from proxy.browsers import ANY, allowed_hosts
from proxy.server.arguments import build_parser
from proxy.server.startup import server_config
from tests.conftest import MODEL, LiveServer

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
BODIES = {"/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 16},
          "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 5}}


def post(server: LiveServer, path: str = "/v1/chat/completions", body: Any = CHAT, **headers: str) -> httpx.Response:
    content = json.dumps(body).encode()
    return httpx.post(server.base_url + path, content=content, headers=headers, timeout=30)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/completions", "/tokenize"])
def test_a_cors_simple_content_type_is_a_415(serve: Callable[..., LiveServer], path: str) -> None:
    server = serve()
    body = BODIES.get(path, CHAT)
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", "TEXT/PLAIN"):
        response = post(server, path, body, **{"content-type": content_type})
        assert response.status_code == 415, response.text
        assert response.json()["error"]["param"] == "Content-Type"
    assert post(server, path, body, **{"content-type": "application/json"}).status_code == 200


def test_a_foreign_host_is_refused_as_dns_rebinding(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    port = server.port
    rebound = post(server, **{"content-type": "application/json", "host": f"attacker.example:{port}",
                              "origin": f"http://attacker.example:{port}"})
    assert rebound.status_code == 421 and rebound.json()["error"]["code"] == "invalid_host"
    assert httpx.get(server.base_url + "/v1/models", headers={"host": f"attacker.example:{port}"}).status_code == 421
    for name in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
        assert httpx.get(server.base_url + "/v1/models", headers={"host": name}).status_code == 200, name


def test_a_foreign_origin_is_refused_and_the_server_s_own_pages_pass(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    json_type = {"content-type": "application/json"}
    refused = post(server, **json_type, origin="https://evil.example")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"
    assert post(server, **json_type, origin="null").status_code == 403
    cancel = post(server, "/v1/responses/resp_x/cancel", {}, **json_type, origin="https://evil.example")
    assert cancel.status_code == 403
    assert post(server, **json_type, origin=f"http://127.0.0.1:{server.port}").status_code == 200  # the playground
    assert post(server, **json_type).status_code == 200  # not a browser: no Origin
    # The same host and port under another scheme is another origin (RFC 6454): an https page is not ours.
    other_scheme = post(server, **json_type, origin=f"https://127.0.0.1:{server.port}")
    assert other_scheme.status_code == 403 and other_scheme.json()["error"]["code"] == "origin_not_allowed"


def test_allowed_origins_get_cors_even_with_an_api_key(serve: Callable[..., LiveServer]) -> None:
    server = serve(allowed_origins=("https://app.example",), api_key="sk-test")
    preflight = httpx.options(server.base_url + "/v1/chat/completions", headers={
        "origin": "https://app.example", "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    headers = {"content-type": "application/json", "origin": "https://app.example", "authorization": "Bearer sk-test"}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", content=json.dumps({**CHAT, "stream": True}),
                      headers=headers, timeout=30) as stream:
        assert stream.status_code == 200
        assert stream.headers["access-control-allow-origin"] == "https://app.example"
        assert stream.read().rstrip().endswith(b"data: [DONE]")
    other = post(server, **{**headers, "origin": "https://evil.example"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_the_cli_derives_the_allowed_hosts_from_where_it_listens() -> None:
    assert allowed_hosts("127.0.0.1", []) == ("localhost", "127.0.0.1", "::1")
    assert allowed_hosts("0.0.0.0", []) == (ANY,)
    assert set(allowed_hosts("0.0.0.0", ["api.example"])) == {"localhost", "127.0.0.1", "::1", "0.0.0.0", "api.example"}
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--allowed-hosts", "a.example,b.example",
                                      "--allowed-hosts", "c.example", "--allowed-origins", "https://x.example"])
    config = server_config(args, "mock")
    assert {"a.example", "b.example", "c.example", "localhost"} <= set(config.allowed_hosts)
    assert config.allowed_origins == ("https://x.example",)


def test_a_websocket_from_a_foreign_origin_or_host_is_refused(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"

    async def handshake(**headers: str) -> int:
        try:
            async with websockets.connect(url, additional_headers=headers):
                return 101
        except websockets.InvalidStatus as refused:
            return refused.response.status_code

    assert asyncio.run(handshake(Origin="https://evil.example")) == 403
    assert asyncio.run(handshake(Host=f"attacker.example:{server.port}")) == 403
    assert asyncio.run(handshake(Origin=server.base_url)) == 101
    assert asyncio.run(handshake(Origin=server.base_url.replace("http://", "https://"))) == 403
    assert asyncio.run(handshake()) == 101
