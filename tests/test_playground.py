"""The playground page (`GET /`), driven in Debian's headless Chromium against servers on the scripted engine.

Chromium is driven through its DevTools protocol over `--remote-debugging-pipe` (JSON messages ending in NUL on
file descriptors 3 and 4), so the tests need no browser download and no Python package beyond the standard
library. They fail, not skip, when Chromium is missing: CI installs it (`apt-get install chromium`).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from parsers.vocab import Vocab
from proxy.engines.base import EngineError
from proxy.engines.scripted import scripted_engine
from tests.conftest import LiveServer
from tests.engines import Failing, Recording
from tests.waiting import eventually

# The README's picture of the page: rewritten only when asked (PLAYGROUND_SCREENSHOT=docs/playground.png), so a
# test run leaves the tree as it found it.
SCREENSHOT = os.environ.get("PLAYGROUND_SCREENSHOT")
QUESTION = "What is the weather in Paris?"
TOOL_TURN = (
    "<|channel|>analysis<|message|>Need the weather for Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city":"Paris"}<|call|>'
)
ANSWER_TURN = (
    "<|channel|>analysis<|message|>The tool says 18C and dry.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 18C in Paris, mild and dry.<|return|>"
)
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check", "--disable-extensions", "--disable-background-networking", "--disable-sync",
    "--no-proxy-server", "--hide-scrollbars", "--mute-audio", "--force-color-profile=srgb",
    "--remote-debugging-pipe",
]


class DevTools:
    """One Chromium process and its DevTools pipe; events are kept, per session, as they pass by."""

    def __init__(self, executable: str, profile: Path) -> None:
        # High descriptor numbers, so that `3<&r 4>&w` cannot clobber one with the other (bash: dash takes one digit).
        commands_in, commands_out = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in os.pipe())
        replies_in, replies_out = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in os.pipe())
        script = f'exec "$0" "$@" 3<&{commands_in} 4>&{replies_out}'
        self.process = subprocess.Popen(
            ["bash", "-c", script, executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(commands_in, replies_out),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(commands_in)
        os.close(replies_out)
        self._commands, self._replies = commands_out, replies_in
        self._buffer = b""
        self._last_id = 0
        self.events: list[dict[str, Any]] = []

    def running(self) -> bool:
        return self.process.poll() is None

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Chromium's answer, waited for as long as it runs (pytest-timeout catches a hang)."""
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._commands, data):]
        while True:
            reply = self._read(method)
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def _read(self, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if not select.select([self._replies], [], [], 1)[0]:
                assert self.running(), f"Chromium exited before it answered {waiting_for}"
                continue
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)


class Page:
    """A tab showing `url`, 1280x860."""

    def __init__(self, tools: DevTools, url: str) -> None:
        self._tools = tools
        self._target = tools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = tools.call("Target.attachToTarget", {"targetId": self._target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self._call(f"{domain}.enable")
        self._call("Emulation.setDeviceMetricsOverride",
                   {"width": 1280, "height": 860, "deviceScaleFactor": 1, "mobile": False})
        self._call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && document.body.dataset.ready === 'true'",
                      "the page to load and run its script")

    def _call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._tools.call(method, params, self._session)

    def evaluate(self, expression: str) -> Any:
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                 "awaitPromise": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str) -> Any:
        """`expression`'s value once it is true, evaluated for as long as Chromium runs (pytest-timeout catches a
        page that never gets there)."""
        return eventually(lambda: self.evaluate(expression), still=self._tools.running, interval=0.02,
                          why=f"Chromium exited waiting for {what}")

    def text(self, selector: str) -> str:
        return self.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? null")

    def texts(self, selector: str) -> list[str]:
        return self.evaluate(f"[...document.querySelectorAll({json.dumps(selector)})].map((n) => n.textContent)")

    def type(self, selector: str, text: str) -> None:
        """Types as a keyboard would (Input.insertText), into the focused field."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self._call("Input.insertText", {"text": text})

    def set_value(self, selector: str, value: str | bool) -> None:
        field = "checked" if isinstance(value, bool) else "value"
        self.evaluate(f"document.querySelector({json.dumps(selector)}).{field} = {json.dumps(value)}")

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def send(self, text: str) -> None:
        """Types a message, sends it, and waits until the exchange has ended."""
        self.type("#message", text)
        self.click("#send")
        self.wait_idle()

    def wait_idle(self) -> None:
        self.wait_for("document.body.dataset.busy === 'false' && !document.querySelector('#key-dialog').open",
                      "the exchange to end")

    def page_errors(self) -> list[dict[str, Any]]:
        """Uncaught exceptions, and security messages (a Content-Security-Policy violation)."""
        mine = [event for event in self._tools.events if event.get("sessionId") == self._session]
        return [event["params"] for event in mine if event["method"] == "Runtime.exceptionThrown"
                or (event["method"] == "Log.entryAdded" and event["params"]["entry"]["source"] == "security")]

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("Page.captureScreenshot", {"format": "png"})["data"]))

    def close(self) -> None:
        self._tools.call("Target.closeTarget", {"targetId": self._target})


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    executable = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(executable, os.X_OK):
        pytest.fail(f"Chromium is needed for the playground tests: {executable} is missing (apt-get install chromium)")
    tools = DevTools(executable, tmp_path_factory.mktemp("chromium-profile"))
    try:
        tools.call("Browser.getVersion")  # the first call waits for Chromium to start
        yield tools
    finally:
        tools.close()


@pytest.fixture
def open_page(chromium: DevTools) -> Iterator[Callable[[LiveServer], Page]]:
    pages: list[Page] = []

    def open_(server: LiveServer) -> Page:
        page = Page(chromium, server.base_url + "/")
        pages.append(page)
        return page

    yield open_
    for page in pages:
        assert page.page_errors() == []
        page.close()


def _last_turn(page: Page, selector: str) -> str:
    return page.text(f".assistant:last-of-type {selector}")


RUNS = {
    "chat": ("chat", True, {}),
    "chat-reasoning-field": ("chat", True, {"reasoning_field": "reasoning"}),
    "responses-previous-id": ("responses", True, {}),
    "responses-full-input": ("responses", False, {}),
    "responses-no-store": ("responses", True, {"store_path": None}),  # the page falls back to the full input
}


@pytest.mark.parametrize("api, chain, config", RUNS.values(), ids=RUNS.keys())
def test_streams_reasoning_answer_and_a_tool_loop(
    serve: Callable[..., LiveServer], open_page: Callable[[LiveServer], Page], vocab: Vocab,
    api: str, chain: bool, config: dict[str, Any], tmp_path: Path,
) -> None:
    engine = Recording(scripted_engine(vocab, [TOOL_TURN, ANSWER_TURN]))
    page = open_page(serve(engine=engine, **config))
    page.wait_for("document.querySelector('#model').value === 'openai/gpt-oss-20b'", "the model from /v1/models")
    page.set_value("#api", api)
    if api == "responses":
        page.set_value("#chain", chain)
    page.set_value("#effort", "high")

    page.send(QUESTION)
    assert page.texts(".user") == [QUESTION]
    assert _last_turn(page, ".reasoning pre") == "Need the weather for Paris."
    assert page.evaluate("document.querySelector('.reasoning').hidden") is False
    assert page.texts(".call-name") == ["get_weather"]
    assert page.texts(".call-args") == ['{"city":"Paris"}']
    assert page.text(".call-id").startswith("call_")
    assert page.evaluate("document.querySelector('.answer').hidden") is True  # a tool call, no answer yet
    first_request = json.loads(page.text("#last-request"))
    effort = first_request["reasoning_effort"] if api == "chat" else first_request["reasoning"]["effort"]
    assert effort == "high"
    # The Harmony prompt panel shows what /tokenize renders: the question, the tool's declaration, the effort.
    page.wait_for("document.querySelector('#prompt-count').textContent !== ''", "the Harmony prompt")
    prompt = page.text("#prompt")
    assert f"<|start|>user<|message|>{QUESTION}<|end|>" in prompt
    assert "type get_weather = (_: {" in prompt and "Reasoning: high" in prompt
    assert prompt == vocab.decode(engine.requests[0].prompt_token_ids)

    page.type(".call-result", '{"temp_c": 18, "sky": "dry"}')
    page.click(".send-results")
    page.wait_idle()
    assert _last_turn(page, ".reasoning pre") == "The tool says 18C and dry."
    assert _last_turn(page, ".answer") == "It is 18C in Paris, mild and dry."
    deltas = page.evaluate("Number(document.querySelector('.assistant:last-of-type .answer').dataset.deltas)")
    assert deltas > 3  # the answer grew token by token
    assert ("finish: stop" if api == "chat" else "completed") in _last_turn(page, ".footer")
    assert page.evaluate("document.querySelector('.send-results').disabled") is True  # the loop moved on

    # The server got the whole loop: question, the model's call, and the typed result.
    second_prompt = vocab.decode(engine.requests[1].prompt_token_ids)
    assert QUESTION in second_prompt and 'to=functions.get_weather' in second_prompt
    assert '{"temp_c": 18, "sky": "dry"}' in second_prompt
    page.wait_for(f"document.querySelector('#prompt').textContent === {json.dumps(second_prompt)}",
                  "the second Harmony prompt")
    second_request = json.loads(page.text("#last-request"))
    stored = "store_path" not in config
    if api == "responses" and chain and stored:
        assert second_request["previous_response_id"].startswith("resp_")
        assert [item["type"] for item in second_request["input"]] == ["function_call_output"]
    elif api == "responses":
        assert "previous_response_id" not in second_request
        assert [item["type"] for item in second_request["input"]] == [
            "message", "reasoning", "function_call", "function_call_output"]
        if not stored:
            assert "not stored: the next request sends the full input" in page.text(".footer")
    if api == "chat" and not config:
        page.screenshot(Path(SCREENSHOT) if SCREENSHOT else tmp_path / "playground.png")


def test_asks_for_the_api_key_and_keeps_it_in_the_page(
    serve: Callable[..., LiveServer], open_page: Callable[[LiveServer], Page]
) -> None:
    server = serve(completions=[ANSWER_TURN], api_key="sekret-key")
    page_response = httpx.get(server.base_url + "/playground")  # static and public; the API is not
    assert page_response.status_code == 200 and "default-src 'none'" in page_response.headers["content-security-policy"]
    assert httpx.get(server.base_url + "/v1/models").status_code == 401

    page = open_page(server)
    page.wait_for("document.querySelector('#key-dialog').open", "the key dialog (GET /v1/models was a 401)")
    assert page.text("#key-reason") == "Incorrect API key provided."
    page.type("#key-input", "wrong-key")
    page.click("#key-ok")
    page.wait_for("document.querySelector('#key-dialog').open && document.querySelector('#key-input').value === ''",
                  "the key dialog to ask again")
    page.type("#key-input", "sekret-key")
    page.click("#key-ok")
    page.wait_for("document.querySelector('#model').value === 'openai/gpt-oss-20b'", "the model list")
    assert page.text("#key-state") == "API key set (this page only)"

    page.send("Hello")
    assert _last_turn(page, ".answer") == "It is 18C in Paris, mild and dry."
    page.wait_for("document.querySelector('#prompt-count').textContent !== ''", "the Harmony prompt")
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0
    assert page.evaluate("document.cookie") == ""


def test_shows_errors_plainly(
    serve: Callable[..., LiveServer], open_page: Callable[[LiveServer], Page], vocab: Vocab
) -> None:
    failing = Failing(scripted_engine(vocab, [ANSWER_TURN]), EngineError("the GPU fell over", 500, "engine_error"),
                      after=6)
    page = open_page(serve(engine=failing))

    page.send(QUESTION)  # Chat Completions: an error frame in the stream, after some reasoning
    assert _last_turn(page, ".reasoning pre").startswith("The tool")
    assert _last_turn(page, ".error") == "Error during the stream · server_error · engine_errorthe GPU fell over"
    assert page.evaluate("document.querySelector('.user').classList.contains('unsent')") is True
    assert page.evaluate("document.querySelector('#message').value") == QUESTION  # back, to send again

    page.set_value("#api", "responses")
    page.set_value("#message", "")
    page.send(QUESTION)  # Responses: a response.failed event
    assert _last_turn(page, ".error") == "Response failed · engine_errorthe GPU fell over"

    page.set_value("#model", "no-such-model")
    page.set_value("#message", "")
    page.send(QUESTION)  # an HTTP error before the stream
    error = _last_turn(page, ".error")
    assert error.startswith("Error · 404 · invalid_request_error · model_not_found")
    assert "`no-such-model` does not exist" in error and error.endswith("param: model")

    page.set_value("#tools", "[{not json")
    page.set_value("#message", "")
    page.send(QUESTION)  # refused in the page, before any request
    assert page.text("#tools-error").startswith("The tool declarations are not valid JSON")


def test_stop_ends_the_stream_and_the_server_request(
    serve: Callable[..., LiveServer], open_page: Callable[[LiveServer], Page], vocab: Vocab
) -> None:
    engine = Recording(scripted_engine(vocab, [ANSWER_TURN], token_delay=0.05))
    page = open_page(serve(engine=engine))
    page.type("#message", QUESTION)
    page.click("#send")
    page.wait_for("document.querySelector('.reasoning pre')?.textContent", "the first reasoning tokens")
    page.click("#stop")
    page.wait_idle()
    assert _last_turn(page, ".footer") == "Stopped: this exchange is not kept in the conversation."
    assert page.evaluate("document.querySelector('.user').classList.contains('unsent')") is True
    # The client left, so the engine request was closed; the control: its answer would have ended (about 1 s).
    eventually(lambda: engine.cancelled.is_set() or engine.finished.is_set())
    assert engine.cancelled.is_set() and not engine.finished.is_set()


def test_says_which_engine_serves_and_speaks_each_apis_tool_form(
    serve: Callable[..., LiveServer], open_page: Callable[[LiveServer], Page], vocab: Vocab,
) -> None:
    page = open_page(serve())  # the mock engine, as `harmony-proxy serve` runs it without a model
    page.wait_for("document.querySelector('#engine').textContent.startsWith('engine: mock')", "the engine")
    assert "placeholders" in page.text("#engine") and "--token-delay-ms" in page.text("#engine")
    assert page.text("#tools-label") == "Chat Completions tool declarations (JSON array)"
    page.set_value("#api", "responses")
    page.evaluate("document.querySelector('#api').dispatchEvent(new Event('change'))")
    assert page.text("#tools-label") == "Responses tool declarations (JSON array)"
    declared = json.loads(page.evaluate("document.querySelector('#tools').value"))
    assert declared[0]["type"] == "function" and declared[0]["name"] == "get_weather" and "function" not in declared[0]
    page.send("Please call get_weather for Paris.")
    assert page.texts(".call-name") == ["get_weather"]  # the mock calls the tool it was offered
    assert json.loads(page.text("#last-request"))["tools"][0]["name"] == "get_weather"
    scripted = open_page(serve(completions=[ANSWER_TURN]))
    scripted.wait_for("document.querySelector('#engine').textContent.startsWith('engine: scripted')", "the engine")
