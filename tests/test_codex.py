"""OpenAI's Codex CLI (`codex exec --json`) against the real server and the scripted engine.

Codex is pinned (0.171.0) in tests/codex/package-lock.json; `npm ci` installs it (with its native binary, a platform
package) once into tests/codex/node_modules (git-ignored) and again only when the lock file changes. Each test
gives Codex a CODEX_HOME of its own: Codex's default configuration plus a provider for the server and one local
MCP server over stdio (tests/mcp_stdio.py). The provider has an `auth` command, since Codex 0.169 reads a
provider's model catalog (`GET /v1/models?client_version=...`) only then. HOME points into the test's folder too,
so nothing is written outside it; Codex may try its own online services, which fail here without mattering.
Every test runs twice: over HTTP, and over the WebSocket mode (`supports_websockets = true` on the provider),
checking in the server's access log that each request came that way.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.engines.scripted import scripted_engine
from tests.conftest import MODEL, LiveServer
from tests.engines import Recording
from tests.node_tools import node_env, node_path, npm_installed

CODEX_DIR = Path(__file__).resolve().parent / "codex"
ROOT = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="module")
def codex_binary() -> Path:
    """The pinned Codex; CODEX_TEST_BINARY (a codex executable) or CODEX_TEST_VERSION (an npm version, installed
    once beside the pinned one) runs the tests against another."""
    if os.environ.get("CODEX_TEST_BINARY"):
        return Path(os.environ["CODEX_TEST_BINARY"]).resolve()
    modules = npm_installed(CODEX_DIR)
    version = os.environ.get("CODEX_TEST_VERSION")
    if not version:
        return modules / ".bin" / "codex"
    folder = modules / ".versions" / version  # git-ignored, and gone with the next `npm ci`
    if not (folder / "node_modules" / ".package-lock.json").exists():
        subprocess.run(["npm", "install", "--prefix", str(folder), "--no-save", "--no-package-lock", "--no-audit",
                        "--no-fund", f"@openai/codex@{version}"], check=True, timeout=300, capture_output=True,
                       env=node_env())
    return folder / "node_modules" / ".bin" / "codex"


AUTH = """
[model_providers.harmony.auth]
command = "echo"
args = ["no-key-needed"]
"""


class Codex:
    """One Codex installation (CODEX_HOME) pointed at a server, and the folder it works in."""

    def __init__(self, binary: Path, folder: Path, server: LiveServer, websocket: bool = False,
                 provider_name: str = "harmony-proxy", settings: str = "", catalog: bool = True) -> None:
        """`settings`: more top-level lines of Codex's config.toml; `catalog`: False leaves out the provider's
        `auth` command, so Codex does not ask for the server's catalog and uses its fallback metadata."""
        self.binary = binary
        self.websocket = websocket
        self.home = folder / "codex-home"
        self.workdir = folder / "project"
        self.home.mkdir()
        self.workdir.mkdir()
        self.env = {"PATH": node_path(), "HOME": str(folder), "CODEX_HOME": str(self.home),
                    "RUST_LOG": "error", "NO_COLOR": "1"}
        self.home.joinpath("config.toml").write_text(f"""\
model = "{MODEL}"
model_provider = "harmony"
{settings}
[model_providers.harmony]
name = "{provider_name}"
base_url = "{server.base_url}/v1"
wire_api = "responses"
supports_websockets = {"true" if websocket else "false"}

{AUTH if catalog else ""}
[mcp_servers.weather]
command = "{sys.executable}"
args = ["-m", "tests.mcp_stdio", "weather"]
cwd = "{ROOT}"
required = true  # Codex waits for it to start before the first request
default_tools_approval_mode = "approve"  # `codex exec` asks no one: without it Codex refuses MCP calls
""", encoding="utf-8")

    def exec(self, *args: str) -> list[dict[str, Any]]:
        """`codex exec --json ARGS`: the JSON events it printed."""
        done = subprocess.run(
            [str(self.binary), "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write", *args],
            check=False, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=45)
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert events, f"no events from codex (exit {done.returncode}): {done.stderr[-3000:]}"
        return events


def items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event["item"] for event in events if event["type"] == "item.completed" and event["item"]["type"] == kind]


def turn_completed(events: list[dict[str, Any]]) -> None:
    failures = [event for event in events if event["type"] in ("turn.failed", "error")]
    assert not failures, failures
    assert events[-1]["type"] == "turn.completed", events[-1]


def responses_requests(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    """The server's access log: (method, status) of each request to /v1/responses, a WebSocket create's is `WS`."""
    return [(record.args[0], record.args[2]) for record in caplog.get_records("call")  # type: ignore[index]
            if record.name == "harmony_proxy.access" and record.args[1] == "/v1/responses"]  # type: ignore[index]


@pytest.fixture(params=["http", "websocket"])
def codex(request: pytest.FixtureRequest, codex_binary: Path, tmp_path: Path,
          caplog: pytest.LogCaptureFixture) -> Iterator[Callable[..., Codex]]:
    """Codex over HTTP (SSE), and over the WebSocket mode (`supports_websockets = true` on the provider)."""
    caplog.set_level(logging.INFO, logger="harmony_proxy.access")
    websocket = request.param == "websocket"
    yield lambda server, **options: Codex(codex_binary, tmp_path, server, websocket, **options)
    # Every request came the way the provider says, and succeeded: no fallback from the WebSocket to HTTP.
    seen = responses_requests(caplog)
    assert seen and set(seen) == {("WS" if websocket else "POST", 200)}, seen


SHELL_CALL = (
    "<|channel|>analysis<|message|>Read the notes first.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.exec_command <|constrain|>json<|message|>{"cmd":"cat notes.txt"}<|call|>'
)
SHELL_ANSWER = (
    "<|channel|>analysis<|message|>The notes greet us.<|end|><|start|>assistant<|channel|>final<|message|>"
    "The notes say hello.<|return|>"
)
SECOND_ANSWER = (
    "<|channel|>analysis<|message|>Asked again.<|end|><|start|>assistant<|channel|>final<|message|>"
    "Still hello.<|return|>"
)
MCP_CALL = (
    "<|channel|>analysis<|message|>Ask the weather server.<|end|><|start|>assistant<|channel|>commentary "
    'to=mcp__weather.get_forecast <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
)
MCP_ANSWER = (
    "<|channel|>analysis<|message|>Sunny.<|end|><|start|>assistant<|channel|>final<|message|>"
    "Paris is sunny, 21C.<|return|>"
)


def started(serve: Callable[..., LiveServer], vocab: Any, completions: list[str]) -> tuple[LiveServer, Recording]:
    engine = Recording(scripted_engine(vocab, completions))
    return serve(engine=engine), engine


def prompts(engine: Recording, vocab: Any) -> list[str]:
    return [vocab.decode(request.prompt_token_ids) for request in engine.requests]


def test_shell_tool_loop_with_reasoning_shown(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex],
    caplog: pytest.LogCaptureFixture
) -> None:
    server, engine = started(serve, vocab, [SHELL_CALL, SHELL_ANSWER])
    agent = codex(server)
    agent.workdir.joinpath("notes.txt").write_text("hello from the notes\n", encoding="utf-8")
    events = agent.exec("What do my notes say?")
    turn_completed(events)
    assert not items(events, "error")  # no "model metadata not found": Codex took the server's catalog entry
    commands = items(events, "command_execution")
    assert [command["exit_code"] for command in commands] == [0]
    assert "hello from the notes" in commands[0]["aggregated_output"]
    assert [item["text"] for item in items(events, "reasoning")] == ["Read the notes first.", "The notes greet us."]
    assert [message["text"] for message in items(events, "agent_message")] == ["The notes say hello."]

    first, second = prompts(engine, vocab)
    assert "You are a coding agent in the Codex CLI" in first  # the catalog's base instructions
    assert "namespace functions" in first and "exec_command" in first
    assert "hello from the notes" in second  # the command's output went back to the model
    assert second.count("Read the notes first.") == 1  # its reasoning too, rendered once (summary and content)
    # Over the WebSocket Codex first pre-warms (`generate: false`, its developer message and tools, nothing
    # generated), then continues from it with `previous_response_id`.
    assert len(responses_requests(caplog)) == len(engine.requests) + agent.websocket


def test_resumed_second_turn(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex],
    caplog: pytest.LogCaptureFixture
) -> None:
    server, engine = started(serve, vocab, [SHELL_CALL, SHELL_ANSWER, SECOND_ANSWER])
    agent = codex(server)
    agent.workdir.joinpath("notes.txt").write_text("hello from the notes\n", encoding="utf-8")
    first = agent.exec("What do my notes say?")
    turn_completed(first)
    thread = first[0]["thread_id"]
    again = agent.exec("resume", thread, "And now?")
    turn_completed(again)
    assert again[0] == {"type": "thread.started", "thread_id": thread}
    assert [message["text"] for message in items(again, "agent_message")] == ["Still hello."]

    third = prompts(engine, vocab)[2]
    for earlier in ("What do my notes say?", "hello from the notes", "The notes say hello.", "And now?"):
        assert earlier in third
    # The first turn ended in an answer: its reasoning is not shown to the model again.
    assert "Read the notes first." not in third and "The notes greet us." not in third
    assert len(responses_requests(caplog)) == len(engine.requests) + 2 * agent.websocket  # a pre-warm per exec


def test_mcp_tool_routed_through_its_namespace(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex]
) -> None:
    server, engine = started(serve, vocab, [MCP_CALL, MCP_ANSWER])
    events = codex(server).exec("What is the weather in Paris?")
    turn_completed(events)
    (call,) = items(events, "mcp_tool_call")
    assert (call["server"], call["tool"], call["status"]) == ("weather", "get_forecast", "completed")
    assert "Paris: sunny, 21C" in json.dumps(call["result"])
    assert [message["text"] for message in items(events, "agent_message")] == ["Paris is sunny, 21C."]
    first, second = prompts(engine, vocab)
    assert "namespace mcp__weather" in first and "get_forecast" in first
    assert "<|start|>mcp__weather.get_forecast to=assistant<|channel|>commentary<|message|>" in second
    assert "Paris: sunny, 21C" in second



def test_freeform_apply_patch_from_the_mock_under_the_grammar(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex]
) -> None:
    # The mock engine calls the tool the user names with what follows the name as its input, under the tool's
    # grammar (Codex's own Lark grammar for apply_patch, enforced with llguidance): the note in the middle is no
    # patch line, so the grammar keeps it out, and Codex applies what was generated.
    from proxy.engines.mock import mock_engine
    from tests.grammars import session_matchers

    engine = Recording(mock_engine(vocab, matchers=session_matchers(vocab)))
    agent = codex(serve(engine=engine))
    events = agent.exec("Please use apply_patch:\n*** Begin Patch\n*** Add File: hello.txt\n+hello from the patch\n"
                        "(a note that is not a patch line)\n*** End Patch\n")
    turn_completed(events)
    (change,) = items(events, "file_change")
    assert change["status"] == "completed", change
    assert [(Path(c["path"]).name, c["kind"]) for c in change["changes"]] == [("hello.txt", "add")]
    assert agent.workdir.joinpath("hello.txt").read_text(encoding="utf-8") == "hello from the patch\n"
    (message,) = items(events, "agent_message")
    assert message["text"].startswith("[mock] The tool apply_patch returned:")
    assert len(engine.requests) == 2
    first, second = (vocab.decode(request.prompt_token_ids) for request in engine.requests)
    assert "apply_patch" in first and "FREEFORM" in first  # declared as a raw-text tool
    # The call went back as generated: the patch without the note, then Codex's report of applying it.
    assert ("to=functions.apply_patch<|message|>*** Begin Patch\n*** Add File: hello.txt\n+hello from the patch\n"
            "*** End Patch\n<|call|><|start|>functions.apply_patch to=assistant<|channel|>commentary<|message|>"
            ) in second
    assert "Success. Updated the following files:\nA hello.txt" in second


SUMMARY = (
    "<|channel|>analysis<|message|>Sum up.<|end|><|start|>assistant<|channel|>final<|message|>"
    "Task: say what notes.txt says. `cat notes.txt` printed: hello from the notes.<|return|>"
)
SECOND_SUMMARY = (
    "<|channel|>analysis<|message|>Sum up again.<|end|><|start|>assistant<|channel|>final<|message|>"
    "Done: told the user the notes say hello (notes.txt: hello from the notes).<|return|>"
)


def test_compacts_on_the_server_and_goes_on(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex], caplog: pytest.LogCaptureFixture
) -> None:
    # Codex's first request (~4.7k tokens, mostly its instructions and tools) passes its auto-compaction limit,
    # so Codex compacts mid-turn after the tool call, and again before the next turn. Codex compacts on the server
    # only for a provider named "OpenAI" (or an Azure one): then it sends a `compaction_trigger` input item
    # (remote_compaction_v2) and later the sealed `compaction` item back. The limit is Codex's own setting: 90% of
    # a window this small would leave the summary no room beside Codex's instructions (the server would trim).
    from proxy.responses.compaction import INSTRUCTION
    from proxy.responses.compaction_items import SUMMARY_HEADING

    engine = Recording(scripted_engine(vocab, [SHELL_CALL, SUMMARY, SHELL_ANSWER, SECOND_SUMMARY, SECOND_ANSWER]))
    agent = codex(serve(engine=engine, max_model_len=8192), provider_name="OpenAI",
                  settings="model_auto_compact_token_limit = 4000")
    agent.workdir.joinpath("notes.txt").write_text("hello from the notes\n", encoding="utf-8")
    first = agent.exec("What do my notes say?")
    turn_completed(first)
    assert [command["exit_code"] for command in items(first, "command_execution")] == [0]
    assert [message["text"] for message in items(first, "agent_message")] == ["The notes say hello."]
    again = agent.exec("resume", first[0]["thread_id"], "And now?")
    turn_completed(again)
    assert [message["text"] for message in items(again, "agent_message")] == ["Still hello."]

    call, compaction, answer, second_compaction, later = prompts(engine, vocab)
    assert INSTRUCTION in compaction and "hello from the notes" in compaction  # the summary's prompt
    assert INSTRUCTION not in call + answer + later
    # The compaction item went to Codex sealed, came back, and the server expanded it into the summary.
    assert SUMMARY_HEADING in answer and "`cat notes.txt` printed: hello from the notes." in answer
    assert "`cat notes.txt` printed" in second_compaction and INSTRUCTION in second_compaction
    # The next turn starts from the second compaction alone: the first summary is replaced, the user's words kept.
    assert "Done: told the user the notes say hello" in later and "`cat notes.txt` printed" not in later
    assert "What do my notes say?" in later and "And now?" in later
    assert len(responses_requests(caplog)) == 5 + 2 * agent.websocket  # no POST /v1/responses/compact either


@pytest.mark.parametrize("codex", ["http"], indirect=True)
def test_a_small_window_alone_makes_codex_compact(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex], caplog: pytest.LogCaptureFixture,
    codex_binary: Path, tmp_path: Path
) -> None:
    # --max-model-len alone: Codex's limit is 90% of the catalog's window, which its first request passes. Codex's
    # instructions and tools (~5.0k tokens in 0.171, fewer in 0.169) then leave the summary less room than it needs,
    # so the server leaves the tool calls and outputs out of the summary's prompt (with a warning) and the session
    # goes on. The window is this Codex's first prompt (measured on a session of its own) and room for a tool call.
    from proxy.responses.compaction import INSTRUCTION
    from proxy.responses.compaction_items import SUMMARY_HEADING

    measured = Recording(scripted_engine(vocab, [SHELL_ANSWER]))
    (tmp_path / "measure").mkdir()
    turn_completed(Codex(codex_binary, tmp_path / "measure", serve(engine=measured), provider_name="OpenAI")
                   .exec("What do my notes say?"))
    window = len(measured.requests[0].prompt_token_ids) + len(vocab.encode_harmony(SHELL_CALL)) + 20
    engine = Recording(scripted_engine(vocab, [SHELL_CALL, SUMMARY, SHELL_ANSWER]))
    agent = codex(serve(engine=engine, max_model_len=window), provider_name="OpenAI")
    agent.workdir.joinpath("notes.txt").write_text("hello from the notes\n", encoding="utf-8")
    events = agent.exec("What do my notes say?")
    turn_completed(events)
    assert [message["text"] for message in items(events, "agent_message")] == ["The notes say hello."]
    _, compaction, answer = prompts(engine, vocab)
    assert INSTRUCTION in compaction and "What do my notes say?" in compaction
    assert "hello from the notes" not in compaction  # the tool output was left out: no room
    assert SUMMARY_HEADING + "Task: say what notes.txt says." in answer
    assert any("did not fit the context" in record.getMessage() for record in caplog.records)
    assert all(len(request.prompt_token_ids) <= window for request in engine.requests)


def png(width: int, height: int) -> bytes:
    """A real PNG image (grey), for Codex to attach."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("catalog", [True, False], ids=["catalog", "fallback-metadata"])
def test_an_attached_image_and_a_resumed_session(
    serve: Callable[..., LiveServer], vocab: Any, codex: Callable[..., Codex], catalog: bool
) -> None:
    # With the server's catalog (text only: Codex leaves the image out itself) and with Codex's fallback metadata
    # (images allowed: Codex sends the image in the user message, and keeps it in the session's history), the turn
    # and the resumed one complete: the model reads a note for the image.
    from proxy.responses.request.content import USER_IMAGE_NOTE

    server, engine = started(serve, vocab, [SHELL_ANSWER, SECOND_ANSWER])
    agent = codex(server, catalog=catalog)
    agent.workdir.joinpath("screen.png").write_bytes(png(8, 8))
    first = agent.exec("What does this screenshot show?", "--image", "screen.png")
    turn_completed(first)
    again = agent.exec("resume", first[0]["thread_id"], "And now?")
    turn_completed(again)
    assert [message["text"] for message in items(again, "agent_message")] == ["Still hello."]
    for prompt in prompts(engine, vocab):
        assert "What does this screenshot show?" in prompt and "iVBOR" not in prompt
        # Codex's own note where the catalog says text only, the server's where Codex sent the image
        note = "image content omitted because you do not support image input" if catalog else USER_IMAGE_NOTE
        assert f'<image name=[Image #1] path="screen.png">\n{note}\n</image>\nWhat does' in prompt
