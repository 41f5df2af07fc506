"""`GET /v1/models`, `GET /v1/models/{model}`, and the probes: `GET /live` (this process works: liveness),
`GET /health` (the engine serves) and `GET /ready` (send it traffic: readiness).

A liveness probe that fails has the process restarted, so it must fail only when a restart would help: /live is
200 whenever the process answers HTTP at all, while the engine loads, an upstream is down, the store is
unreachable or the server drains. /health and /ready are 503 then, and restarting would not make them 200."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.codex_catalog import codex_model_info
from proxy.engines.base import EngineError
from proxy.errors import APIError
from proxy.state import ServerState


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.config.served_model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "openai",
        "max_model_len": state.config.prompt_limit,
    }


async def list_models(request: Request) -> Response:
    """OpenAI's list; asked with `client_version`, as Codex asks, also Codex's catalog (proxy/codex_catalog.py)."""
    state: ServerState = request.app.state.harmony
    listed: dict[str, Any] = {"object": "list", "data": [_model_card(state)]}
    if "client_version" in request.query_params:
        listed["models"] = [codex_model_info(state.config)]
    return JSONResponse(listed)


async def retrieve_model(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    state.check_model(request.path_params["model"])
    return JSONResponse(_model_card(state))


async def live(request: Request) -> Response:
    """200 whenever this process serves HTTP (liveness): nothing it depends on is asked."""
    return JSONResponse({"status": "alive"})


async def health(request: Request) -> Response:
    """200 once the engine can serve; 503 with the reason before that, or while it cannot."""
    state: ServerState = request.app.state.harmony
    engine = state.engine
    if not engine.ready:
        raise APIError(503, f"The {engine.name} engine is starting.", code="engine_starting")
    try:
        await engine.check_health()
    except EngineError as exc:
        raise APIError(503, exc.message, code=exc.code or "engine_unavailable") from None
    return JSONResponse({"status": "ok", "engine": engine.name, "model": state.config.served_model_name})


async def ready(request: Request) -> Response:
    """200 while this replica should be sent requests: the engine loaded and answering, the store reachable, and
    not draining (proxy/draining.py); else 503 saying which. `/live` is the liveness check."""
    state: ServerState = request.app.state.harmony
    if state.draining.draining:
        raise APIError(503, "The server is shutting down.", code="draining")
    await health(request)
    if state.responses is not None:
        try:
            await state.responses.check()
        except Exception as exc:  # noqa: BLE001  # whatever the backend's driver raises: not ready
            raise APIError(503, f"The response store is unreachable: {type(exc).__name__}.",
                           code="store_unavailable") from None
    return JSONResponse({"status": "ready", "engine": state.engine.name, "model": state.config.served_model_name})


async def kv_event_sources(request: Request) -> Response:
    """Where the engine publishes its KV-cache events, as vLLM's own `GET /kv_event_sources` answers (the in-process
    vLLM engine started with --kv-events-config): routers in front of this replica subscribe there. 503 while the
    engine starts; 404 for an engine that publishes none."""
    engine = request.app.state.harmony.engine
    if not engine.ready:
        raise APIError(503, f"The {engine.name} engine is starting.", code="engine_starting")
    sources = getattr(engine, "kv_event_sources", None)
    if sources is None:
        raise APIError(404, f"The {engine.name} engine publishes no KV-cache events.", code="not_found")
    return JSONResponse(sources)
