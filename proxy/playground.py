"""`GET /` and `GET /playground`: a page for trying the server in a browser (`proxy/playground.html`).

The page is static, so it is public like /health; the API calls it makes carry the key the user types, which
the page keeps in memory only. Its Content-Security-Policy lets only the page's own inline script and style run
(by hash) and only this server be called: nothing the model writes can load or send anything.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_INLINE = {kind: re.compile(f"<{kind}>(.*?)</{kind}>", re.DOTALL) for kind in ("script", "style")}


@cache  # the file is read once per process; the tuple is never changed
def _page() -> tuple[bytes, dict[str, str]]:
    html = files("proxy").joinpath("playground.html").read_text(encoding="utf-8")
    hashes = {kind: " ".join(_source_hash(block) for block in pattern.findall(html))
              for kind, pattern in _INLINE.items()}
    policy = (
        f"default-src 'none'; script-src {hashes['script']}; style-src {hashes['style']}; connect-src 'self'; "
        "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {
        "content-security-policy": policy,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-cache",
    }
    return html.encode(), headers


def _source_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


async def playground(request: Request) -> Response:
    body, headers = _page()
    return Response(body, media_type="text/html; charset=utf-8", headers=headers)


PLAYGROUND_ROUTES = [Route("/", playground, methods=["GET"]), Route("/playground", playground, methods=["GET"])]
PLAYGROUND_PATHS = frozenset(route.path for route in PLAYGROUND_ROUTES)  # public under --api-key: the page is static
