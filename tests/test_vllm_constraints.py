"""Output constraints enforced by a real vLLM's own grammar backend, in each `--upstream-guided-decoding` mode, with
the vLLM flags docs/upstream.md gives; and `/ready` while a vLLM loads and after it dies.

The tiny gpt-oss writes noise (tests/vllm_server.py), so a valid call or JSON answer can only come from the grammar
reaching vLLM's sampler. The session's vLLM serves its token-only endpoint (`--enable-scale-out`), where
harmony-proxy sends the xgrammar and final-json cases; the guidance vLLM does not, and gets the llguidance cases on
`/v1/completions`. vLLM runs one grammar backend per process, picked by its first constrained request under
its default `auto`: the session's vLLM runs xgrammar, and this module starts a second one with guidance (llguidance),
which also serves the readiness test (its load observed, its death last in this module).

xgrammar reads Harmony's special tokens as the text they spell, so it lets them into a JSON string or free text
(our parser then ends the message there); the xgrammar cases use schemas of enums, integers and booleans, where no
special token fits. llguidance keeps special tokens out of text: its cases may hold strings.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from parsers.vocab import Vocab
from proxy.app import create_app
from proxy.config import ServerConfig
from proxy.engines.upstream.engine import UpstreamEngine
from proxy.state import ServerState
from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import client_for
from tests.test_vllm import front
from tests.vllm_server import VllmServer

# The first test of a session waits for vLLM to load (a minute or two on 2 busy cores).
pytestmark = pytest.mark.timeout(900)
ALARM = {"type": "object", "properties": {"day": {"enum": ["mon", "tue", "wed"]},
                                          "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                          "loud": {"type": "boolean"}},
         "required": ["day", "hour", "loud"], "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
NOTE = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 12}}, "required": ["title"],
        "additionalProperties": False}
SCHEMAS = {"set_alarm": ALARM, "get_time": ZONE, "add_note": NOTE}


def tool(name: str, strict: bool = False) -> dict[str, Any]:
    function = {"name": name, "description": f"{name}.", "parameters": SCHEMAS[name]}
    return {"type": "function", "function": {**function, "strict": True} if strict else function}


REPORT = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 5}},
          "required": ["ok", "level"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
PIN = {"type": "custom", "name": "pin", "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]{4}"}}
QUERY_GRAMMAR = 'start: "SELECT " COLUMN " FROM t" ("WHERE " COLUMN "=" DIGIT)?\nCOLUMN: "a" | "b"\nDIGIT: /[0-9]/'
QUERY = {"type": "custom", "name": "query", "format": {"type": "grammar", "syntax": "lark",
                                                       "definition": QUERY_GRAMMAR}}
QUERY_TEXT = re.compile(r"SELECT [ab] FROM t(WHERE [ab]=[0-9])?")
ASK = [{"role": "user", "content": "Do it."}]


@pytest.fixture(scope="module")
def guidance(tiny_gpt_oss: Path, vocab: Vocab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A vLLM with `--structured-outputs-config.backend guidance`, and a harmony-proxy on it started before it:
    the proxy's /ready codes while vLLM loaded are in "while_loading"."""
    log = tmp_path_factory.mktemp("vllm-guidance") / "vllm.log"
    server = VllmServer(tiny_gpt_oss, ("--structured-outputs-config.backend", "guidance"), log_path=log).start()
    engine = UpstreamEngine(vocab, [server.base_url], server.model, "vllm", guided_decoding="llguidance")
    proxy = LiveServer(create_app(ServerState(ServerConfig(), vocab, engine, None)), engine).start()
    try:
        while_loading = []
        progress, changed = server.progress(), time.monotonic()  # waited for while vLLM makes progress
        while (code := httpx.get(proxy.base_url + "/ready", timeout=10).status_code) != 200:
            while_loading.append(code)
            assert server.process.poll() is None, server.log_tail()
            if (now := server.progress()) != progress:
                progress, changed = now, time.monotonic()
            assert time.monotonic() - changed < 300, f"vLLM made no progress for 300 s: {server.log_tail()}"
            time.sleep(0.5)
        server.wait_ready()
        yield {"vllm": server, "proxy": proxy, "while_loading": while_loading}
    finally:
        proxy.stop()
        server.stop()


def call_of(reply: Any) -> tuple[str, Any]:
    """The one call of a Chat Completions reply: (name, parsed arguments)."""
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls and len(calls) == 1, reply
    return calls[0].function.name, json.loads(calls[0].function.arguments)


def check_function_calls(client: Any, vllm: VllmServer, names: tuple[str, ...]) -> None:
    """tool_choice required, then named, then a strict tool under auto: every call valid against its schema. vLLM
    stops at the `<|call|>` we name as a stop token: its own count of generated tokens is the completion's."""
    tools = [tool(name) for name in names]
    before = vllm.metrics()["vllm:generation_tokens_total"]
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required",
                                           max_tokens=300, seed=1)
    name, arguments = call_of(reply)
    jsonschema.validate(arguments, SCHEMAS[name])
    assert reply.usage.completion_tokens < 300
    assert vllm.metrics()["vllm:generation_tokens_total"] - before == reply.usage.completion_tokens
    for seed in range(2):
        named = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, max_tokens=300, seed=seed,
                                               tool_choice={"type": "function", "function": {"name": names[-1]}})
        name, arguments = call_of(named)
        assert name == names[-1]
        jsonschema.validate(arguments, SCHEMAS[name])
    strict_calls = 0
    for seed in range(8):  # auto: the noise may answer instead; a call it makes must be valid
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[tool(names[0], strict=True)],
                                               max_tokens=300, seed=seed)
        if reply.choices[0].message.tool_calls:
            jsonschema.validate(call_of(reply)[1], SCHEMAS[names[0]])
            strict_calls += 1
            break
    assert strict_calls == 1


def check_json_answers(client: Any) -> None:
    for seed in range(2):
        reply = client.chat.completions.create(model=MODEL, messages=ASK, response_format=JSON_FORMAT,
                                               max_tokens=300, seed=seed)
        assert reply.choices[0].finish_reason == "stop", reply
        jsonschema.validate(json.loads(reply.choices[0].message.content), REPORT)


def custom_input(client: Any, tool: dict[str, Any]) -> str:
    response = client.responses.create(model=MODEL, input="Do it.", tools=[tool], store=False,
                                       tool_choice={"type": "custom", "name": tool["name"]}, max_output_tokens=300)
    calls = [item for item in response.output if item.type == "custom_tool_call"]
    assert response.status == "completed" and len(calls) == 1 and calls[0].name == tool["name"], response
    return calls[0].input


def test_xgrammar_mode(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer) -> None:
    """vLLM started with `--structured-outputs-config.backend xgrammar` (the session's), harmony-proxy with
    `--upstream-guided-decoding xgrammar`: the whole completion's structural tag."""
    client = client_for(front(serve, vocab, vllm, "xgrammar"))
    check_function_calls(client, vllm, ("set_alarm", "get_time"))
    check_json_answers(client)
    for _ in range(2):
        assert re.fullmatch("[0-9]{4}", custom_input(client, PIN))


def test_final_json_mode(serve: Callable[..., LiveServer], vocab: Vocab, vllm: VllmServer) -> None:
    """`--upstream-guided-decoding final-json`: only the answer's schema; vLLM 0.32 applies it from the first token
    (its gpt-oss reasoning parser reports the reasoning ended from the start), so the answer is the bare JSON."""
    check_json_answers(client_for(front(serve, vocab, vllm, "final-json")))


def test_llguidance_mode(guidance: dict[str, Any]) -> None:
    """vLLM with `--structured-outputs-config.backend guidance`, harmony-proxy with `--upstream-guided-decoding
    llguidance`: the whole completion's Lark grammar, custom tools' Lark grammars included."""
    client = client_for(guidance["proxy"])
    check_function_calls(client, guidance["vllm"], ("add_note", "set_alarm"))
    # This vLLM runs without --enable-scale-out: its token-only endpoint answers 403, the requests went to
    # /v1/completions (the session's vLLM, which has it, enforces the same through /inference/v1/generate).
    assert guidance["proxy"].engine._endpoints.known(0) is False
    check_json_answers(client)
    assert re.fullmatch("[0-9]{4}", custom_input(client, PIN))
    for _ in range(2):
        assert QUERY_TEXT.fullmatch(custom_input(client, QUERY))


def test_ready_while_vllm_loads_and_after_it_dies(guidance: dict[str, Any]) -> None:
    """Last in this module: it kills the module's vLLM."""
    proxy, server = guidance["proxy"], guidance["vllm"]
    assert guidance["while_loading"] and set(guidance["while_loading"]) == {503}
    assert httpx.get(proxy.base_url + "/ready", timeout=10).status_code == 200
    server.kill()
    while (reply := httpx.get(proxy.base_url + "/ready", timeout=None)).status_code != 503:  # pytest-timeout: a hang
        time.sleep(0.1)
    assert "No upstream is reachable" in reply.json()["error"]["message"]
    failed = httpx.post(proxy.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=30)
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "upstream_unavailable"
