"""What a new user meets first: --version, --help with its defaults, and start-up logs that say what matters once.

The servers run as `python -m proxy serve` processes on loopback, their logs read as a user reads them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from proxy.server.arguments import build_parser
from tests.conftest import MODEL, LiveServer
from tests.test_vocab_and_cli import clean_env, free_port, start, stop, wait_healthy

ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def run(*arguments: str) -> str:
    done = subprocess.run([sys.executable, "-m", "proxy", *arguments], check=True, capture_output=True, text=True,
                          timeout=60)
    return done.stdout


def test_version_names_the_installed_package() -> None:
    assert run("--version").strip().startswith("harmony-proxy 0.")


def test_help_shows_defaults_and_each_spelling_once() -> None:
    text = " ".join(run("serve", "--help").split())
    assert "--port PORT port to listen on (default 8000)" in text
    assert "--upstream-routing {cache-aware,round-robin}" in text and "(default cache-aware)" in text
    assert "round robin)" not in text  # --upstream-url repeats for replicas, routed cache-aware by default
    serve = next(action for action in build_parser()._actions if action.dest == "command").choices["serve"]
    for action in serve._actions:  # each spelling once, and the metavar once after them all
        assert len(set(action.option_strings)) == len(action.option_strings), action.option_strings
        if len(action.option_strings) > 1 and action.nargs != 0:
            choices = "{" + ",".join(action.choices) + "}" if action.choices else None
            metavar = action.metavar or choices or action.dest.upper()
            assert f"{', '.join(action.option_strings)} {metavar}" in text
    assert "never Authorization, Proxy-Authorization, Cookie, X-Api-Key or Api-Key" in text


def test_help_never_prints_a_secret_from_the_environment(tmp_path: Path) -> None:
    env = {"HARMONY_PROXY_API_KEY": "sk-zq9-api", "HARMONY_PROXY_REASONING_KEY": "zq9-reasoning-key-1234",
           "HARMONY_PROXY_UPSTREAM_API_KEY": "sk-zq9-upstream", "HARMONY_PROXY_STORE_URL": "postgresql://u:zq9@db/x"}
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--help"], check=True, capture_output=True,
                          text=True, timeout=60, env={**clean_env(tmp_path), **env})
    assert "zq9" not in done.stdout


def test_the_mock_starts_without_warnings(tmp_path: Path) -> None:
    port = free_port()
    process = start([sys.executable, "-m", "proxy", "serve", "--port", str(port)], clean_env(tmp_path))
    try:
        wait_healthy(port, process)
        missing = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={**ASK, "model": "gpt-oss-20b"},
                             timeout=30)
    finally:
        output = stop(process)
    assert missing.status_code == 404 and f"This server serves `{MODEL}`" in missing.json()["error"]["message"]
    assert [line for line in output.splitlines() if " WARNING " in line] == []
    assert "sealed with a random key" in output  # said, not warned: one process needs no shared key


def test_upstream_mode_logs_each_call_once_and_where_responses_go(tmp_path: Path,
                                                                  serve: Callable[..., LiveServer]) -> None:
    back = serve()
    port = free_port()
    env = clean_env(tmp_path, NO_PROXY="127.0.0.1")  # the upstream is on loopback
    process = start([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream-url",
                     back.base_url + "/v1"], env)
    try:
        wait_healthy(port, process)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=ASK, timeout=30)
    finally:
        output = stop(process)
    assert answer.status_code == 200
    assert "HTTP Request:" not in output  # httpx's own line for each upstream call
    assert output.count("POST /v1/chat/completions 200") == 1  # the access line
    stored = Path(env["XDG_DATA_HOME"]) / "harmony-proxy" / "responses.sqlite3"
    assert f"storing responses in {stored}" in output and stored.exists()


def test_the_store_url_is_logged_without_its_password(tmp_path: Path) -> None:
    # An unreachable database stops the server at start, with one line that says where it is and why it cannot be
    # reached (a reachable one is logged as "storing responses in PostgreSQL at ...", its password left out).
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--port", str(free_port()), "--store-url",
                           "postgresql://alice:pw-hidden@127.0.0.1:9/responses"], check=False, capture_output=True,
                          text=True, timeout=90, env=clean_env(tmp_path))
    assert "cannot connect to the PostgreSQL store 127.0.0.1:9/responses: " in done.stderr
    assert "pw-hidden" not in done.stderr and done.returncode == 2


def test_the_upstream_front_end_says_ready_only_once_its_upstream_listens(tmp_path: Path) -> None:
    """The laptop recipe started front end first: while its upstream is not listening the front end says why it
    cannot serve and /ready is 503; "ready" is logged once the upstream answers, not before."""
    upstream_port, port = free_port(), free_port()
    log = tmp_path / "front.log"
    env = clean_env(tmp_path, NO_PROXY="127.0.0.1")
    with log.open("w") as out:
        front = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream-url",
                                  f"http://127.0.0.1:{upstream_port}/v1"], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, text=True)
    back = None
    try:
        wait_for(lambda: "cannot serve yet" in log.read_text(), front)
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=30).status_code == 503
        assert "engine is ready" not in log.read_text()
        back = start([sys.executable, "-m", "proxy", "serve", "--port", str(upstream_port)], clean_env(tmp_path))
        wait_healthy(upstream_port, back)
        wait_for(lambda: "engine is ready" in log.read_text(), front)
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=30).status_code == 200
    finally:
        stop(front)
        if back is not None:
            stop(back)
    text = log.read_text()
    waiting = next(line for line in text.splitlines() if "cannot serve yet" in line)
    assert f"http://127.0.0.1:{upstream_port}/v1: connection failed" in waiting and " WARNING " in waiting
    assert text.count("cannot serve yet") == 1  # said once, not at every check
    assert text.index("cannot serve yet") < text.index("the upstream engine is ready")


def wait_for(condition: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    """Until `condition` holds, as long as the process runs (it makes progress: it checks, backing off)."""
    while not condition():
        assert process.poll() is None, "the server stopped"
        time.sleep(0.1)


def test_the_api_key_guards_every_route_but_those_help_names(serve: Callable[..., LiveServer]) -> None:
    serve_command = next(action for action in build_parser()._actions if action.dest == "command").choices["serve"]
    said = next(action.help for action in serve_command._actions if action.dest == "api_key")
    open_routes = re.findall(r"(/\w+)", said.split("every route but ", 1)[1].split(" and the playground", 1)[0])
    assert open_routes == ["/live", "/health", "/ready"]
    server = serve(api_key="sk-first-hour")
    for path in [*open_routes, "/"]:  # the playground page too
        assert httpx.get(server.base_url + path, timeout=30).status_code == 200, path
    for path in ["/v1/models", "/metrics"]:  # /metrics too, unless --metrics-public
        assert httpx.get(server.base_url + path, timeout=30).status_code == 401, path


@pytest.mark.parametrize("arguments", [["--version"], ["serve", "--help"], ["serve", "--port", "not-a-port"]])
def test_the_command_line_answers_without_importing_the_server(arguments: list[str]) -> None:
    """--version, --help and usage errors import the options alone: not the application or the APIs."""
    code = ("import sys\nfrom proxy.server.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('proxy.app', 'proxy.server.serving', 'starlette.applications', "
            "'proxy.responses.transport.websocket', 'mcp') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
