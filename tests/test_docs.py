"""The README and docs/ stay true: their code blocks run, and every option they name is the server's.

A block that cannot run here (a GPU, Docker, a cluster) says so right above it, visibly:
`<!-- not-run: the reason -->`. Every other block is run by its kind: `python` against a mock server, `sh` by its
commands (`curl` against a mock server, `harmony-proxy serve` started until /health answers, `python benchmarks/`
scripts checked to exist and to take the options given), `json`/`toml`/`yaml` parsed. A block of another shell
command, unmarked, fails: the test never guesses what may be skipped.

Options: every `--option` a page names must be one of `harmony-proxy serve`'s, with two exceptions that the page
itself makes visible: options spelled with an underscore are trtllm-serve's (`--tp_size`; harmony-proxy's own are
dashed, and trtllm-serve's flags pass through to it), and a page lists other tools' options it names in a comment,
`<!-- options of other tools: --url --concurrency -->`. A page that names `benchmarks/X.py` may name X's options.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.server.arguments import build_parser
from tests.conftest import LiveServer
from tests.test_vocab_and_cli import free_port, start, stop, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!-- not-run: (\S.*?) -->")
OTHER_TOOLS = re.compile(r"<!-- options of other tools: (.*?) -->", re.DOTALL)
OPTION = re.compile(r"(?<![\w/.-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
DATA = {"json", "toml", "yaml", "yml"}
SHELL = {"sh", "bash"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    not_run: str | None  # the reason given, when the block is marked

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked = NOT_RUN.fullmatch(before.strip())
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group(1), match.group(2), marked.group(1) if marked else None))
    return found


ALL = [block for page in PAGES for block in blocks(page)]
RUNNABLE = [block for block in ALL if block.not_run is None]


def commands(code: str) -> list[str]:
    """A shell block's commands: continuation lines and open quotes joined, comments and blank lines left out."""
    found, pending = [], ""
    for line in re.sub(r"\\\n\s*", " ", code).splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line.strip()
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open: the command goes on
            continue
        found.append(pending)
        pending = ""
    assert not pending, f"an unclosed quote in {code!r}"
    return found


def serve_arguments(command: str) -> list[str] | None:
    """The arguments after `harmony-proxy serve` (environment assignments and a venv path allowed), else None."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    if len(words) >= 2 and words[0].endswith("harmony-proxy") and words[1] == "serve":
        return words[2:]
    return None


def test_the_pages_have_runnable_blocks_and_every_marker_gives_a_reason() -> None:
    assert len(PAGES) >= 10 and len(RUNNABLE) >= 10
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        markers = re.findall(r"<!-- not-run:.*?-->", text)
        assert len(markers) == len(NOT_RUN.findall(text)), f"{page}: a not-run marker without its reason"
        assert len(markers) == sum(1 for block in blocks(page) if block.not_run), f"{page}: a marker not on a block"


@pytest.fixture
def mock_url(serve: Callable[..., LiveServer]) -> str:
    return serve().base_url


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.language == "python"], ids=str)
def test_python_blocks_run_against_the_mock(block: Block, mock_url: str) -> None:
    code = block.code.replace("http://127.0.0.1:8000", mock_url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{block}: {done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{block} printed nothing"


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.language in DATA], ids=str)
def test_data_blocks_parse(block: Block) -> None:
    if block.language == "toml":
        tomllib.loads(block.code)
    elif block.language == "json":  # a JSON value, or JSON Lines
        try:
            json.loads(block.code)
        except json.JSONDecodeError:
            for line in filter(str.strip, block.code.splitlines()):
                json.loads(line)
    else:
        list(yaml.safe_load_all(block.code))


class Ports:
    """The loopback ports a page writes, each mapped to a free one: commands that share a port on the page share one
    in the test, commands that do not, do not (a page whose commands collide fails as a reader's would)."""

    def __init__(self, mapped: dict[int, int] | None = None) -> None:
        self.mapped = dict(mapped or {})

    def port(self, written: int) -> int:
        return self.mapped.setdefault(written, free_port())

    def command(self, command: str) -> str:
        command = re.sub(r"(127\.0\.0\.1|localhost):(\d+)", lambda m: f"{m[1]}:{self.port(int(m[2]))}", command)
        return re.sub(r"--port([ =])(\d+)", lambda m: f"--port{m[1]}{self.port(int(m[2]))}", command)


def listening_port(arguments: list[str]) -> int | None:
    """The port a `harmony-proxy serve` command line names (its last --port), else None (8000, the default)."""
    found = None
    for index, word in enumerate(arguments):
        if word == "--port" and index + 1 < len(arguments):
            found = int(arguments[index + 1])
        elif word.startswith("--port="):
            found = int(word.split("=", 1)[1])
    return found


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[[list[str]], None]]:
    """started(arguments): `harmony-proxy serve ARGUMENTS` (on a free port unless they name one), until its /health
    answers 200."""
    processes: list[subprocess.Popen[str]] = []

    def start_serving(arguments: list[str]) -> None:
        port = listening_port(arguments)
        if port is None:
            port = free_port()
            arguments = [*arguments, "--port", str(port)]
        env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path),
               "NO_PROXY": "127.0.0.1,localhost"}
        processes.append(start([sys.executable, "-m", "proxy", "serve", *arguments], env))
        wait_healthy(port, processes[-1])

    yield start_serving
    for process in processes:
        stop(process)


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.language in SHELL], ids=str)
def test_shell_blocks_run(block: Block, mock_url: str, started: Callable[[list[str]], None]) -> None:
    ports = Ports({8000: int(mock_url.rsplit(":", 1)[1])})  # the page's default server: a mock
    for command in commands(block.code):
        command = ports.command(command)
        arguments = serve_arguments(command)
        if arguments is not None:
            started(arguments)
        elif command.startswith("curl "):
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False,
                                  env={**os.environ, "NO_PROXY": "127.0.0.1,localhost"})
            assert done.returncode == 0, f"{block}: {done.stderr}"
            assert "error" not in json.loads(done.stdout), f"{block}: {done.stdout}"
        elif command.startswith("python benchmarks/"):
            script, *rest = shlex.split(command, comments=True)[1:]
            source = (ROOT / script).read_text(encoding="utf-8")
            rest = rest[:rest.index("-m")] if "-m" in rest else rest  # after -m: the module's own arguments
            for option in (word.split("=")[0] for word in rest if word.startswith("--")):
                assert f'"{option}"' in source, f"{block}: {script} has no option {option}"
        else:
            raise AssertionError(f"{block}: `{command}` is run by no rule here; mark the block "
                                 "<!-- not-run: why --> if it cannot run here")


def serve_options() -> dict[str, str]:
    """Every option string of `harmony-proxy serve`, with the title of its group."""
    parser = build_parser()
    serve = next(action for action in parser._actions if action.dest == "command").choices["serve"]
    return {option: group.title or "" for command in (parser, serve) for group in command._action_groups
            for action in group._group_actions for option in action.option_strings}


def test_every_option_a_page_names_is_the_servers() -> None:
    ours = serve_options()
    wrong = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        others = {option for listed in OTHER_TOOLS.findall(text) for option in OPTION.findall(listed)}
        text = OTHER_TOOLS.sub("", text)
        scripts = "".join((ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
                          for name in set(re.findall(r"benchmarks/(\w+)\.py", text)))
        for line_number, line in enumerate(text.splitlines(), 1):
            for option in OPTION.findall(line):
                if option in ours or option in others or "_" in option or f'"{option}"' in scripts:
                    continue
                wrong.append(f"{page.relative_to(ROOT)}:{line_number}: {option}")
    assert not wrong, "options the server lacks (or list them as other tools' options):\n" + "\n".join(wrong)


def test_the_options_page_names_every_option() -> None:
    text = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    named = set(OPTION.findall(text))
    missing = [option for option, group in serve_options().items()
               if not group.startswith("trtllm") and option.startswith("--") and "_" not in option
               and option not in named and option != "--help" and not option.startswith("--num-serve")]
    assert not missing, f"docs/options.md lacks {missing}"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Run the tests", 1)[1]
    command = next(block.code.strip() for block in blocks(ROOT / "README.md")
                   if block.line > readme[:readme.index("## Run the tests")].count("\n") and "pytest" in block.code)
    assert command in section
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci == command


def options_table() -> list[tuple[str, str]]:
    """docs/options.md's table of options: (the option cell, the default cell) of each row."""
    text = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    table = text.split("| option | default | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = [re.split(r"(?<!\\)\|", line)[1:3] for line in table.strip().splitlines()[1:]]
    return [(option.strip(), default.strip()) for option, default in rows]


def shown(value: object) -> str:
    """A default as the table writes it: 30.0 is 30."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def test_the_options_table_gives_each_options_choices_and_default() -> None:
    """Each option of `harmony-proxy serve` in docs/options.md with the parser's own choices (all of them) and
    default: a fixed default is written as it is, an environment variable's as `$NAME`, a flag's as off."""
    parser = build_parser()
    serve = next(action for action in parser._actions if action.dest == "command").choices["serve"]
    rows = options_table()
    wrong = []
    for action in serve._actions:
        options = [option for option in action.option_strings if option.startswith("--") and "_" not in option]
        if not options or action.dest == "help" or options[0].startswith("--num-serve"):
            continue
        row = next(((cell, default) for cell, default in rows if set(OPTION.findall(cell)) & set(options)), None)
        if row is None:
            wrong.append(f"{options[0]}: no row")
            continue
        cell, default = row
        if action.choices:
            listed = re.search(rf"`{re.escape(next(o for o in options if o in cell))} ([^`]*)`", cell)
            if listed is None or set(listed.group(1).split("\\|")) != set(action.choices):
                wrong.append(f"{options[0]}: the choices are {'|'.join(action.choices)}, the table says {cell}")
        environment = re.search(r"set (HARMONY_PROXY_[A-Z_]+)", action.help or "")
        if environment:
            expected = f"`${environment.group(1)}`"
        elif action.nargs == 0:
            expected = "off" if action.default is False else ""
        elif action.default in (None, [], ()):
            continue  # described in words: what the server does without it
        else:
            expected = shown(action.default)
        if expected not in default and not (expected == "" and default == ""):
            wrong.append(f"{options[0]}: the default is {expected!r}, the table says {default!r}")
    assert not wrong, "docs/options.md disagrees with the parser:\n" + "\n".join(wrong)


def test_the_documented_access_line_is_the_servers(tmp_path: Path) -> None:
    """docs/observability.md's access line has the shape of a real one: its request id, its fields in order."""
    text = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    documented = next(line for line in text.splitlines() if " INFO harmony_proxy.access [" in line)
    port = free_port()
    process = start([sys.executable, "-m", "proxy", "serve", "--port", str(port)],
                    {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)})
    try:
        wait_healthy(port, process)
        body = {"model": "openai/gpt-oss-20b", "messages": [{"role": "user", "content": "hi"}]}
        request_id = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                                timeout=60).headers["x-request-id"]
    finally:
        output = stop(process)
    real = next(line for line in output.splitlines() if f"harmony_proxy.access [{request_id}]" in line)

    def shape(line: str) -> tuple[str, list[str]]:
        head, fields = line.split("]: ", 1)
        return re.sub(r"[0-9a-f]", "h", head.split("[", 1)[1]), re.findall(r" (\w+)=", fields)

    assert shape(documented) == shape(real), (documented, real)
