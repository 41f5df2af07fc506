"""`harmony-proxy` (also `python -m proxy`): the command line.

Parsing it imports the options alone (`arguments.py`): `--version`, `--help` and usage errors answer without
importing the server, which `serving.py` builds and runs once the command line is valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.server.arguments import parse_command_line

if TYPE_CHECKING:
    from starlette.applications import Starlette


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_command_line(argv)
    from proxy.server.serving import serve  # the server: imported once the command line is valid

    serve(args, argv)


def worker_app() -> Starlette:
    """The application of one `--workers` process (uvicorn calls this factory in each, `proxy/server/workers.py`)."""
    from proxy.server.serving import worker_app as app

    return app()
