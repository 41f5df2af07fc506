"""The Starlette application: routes, error handlers, and the engine's life cycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route, WebSocketRoute

from proxy.auth import APIKeyMiddleware
from proxy.browsers import BrowserGuard
from proxy.chat.routes import chat_completions, tokenize
from proxy.completions import completions
from proxy.disconnect import ClientDisconnected, client_gone_handler
from proxy.engines.base import EngineError
from proxy.errors import (
    APIError,
    api_error_handler,
    engine_error_handler,
    http_error_handler,
    store_unavailable_handler,
    unexpected_error_handler,
    unstorable_handler,
)
from proxy.playground import PLAYGROUND_PATHS, PLAYGROUND_ROUTES
from proxy.responses import conversations
from proxy.responses.compaction import compact_response
from proxy.responses.input_tokens import count_input_tokens
from proxy.responses.transport.routes import (
    cancel_response,
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)
from proxy.responses.transport.websocket import responses_socket
from proxy.sse import KeepRawSend
from proxy.state import ServerState
from proxy.status import health, kv_event_sources, list_models, live, ready, retrieve_model
from proxy.store.base import StoreUnavailable, Unstorable
from proxy.telemetry.metrics import metrics_endpoint
from proxy.telemetry.observer import RequestObserver

logger = logging.getLogger("harmony_proxy")


def create_app(
    state: ServerState, on_engine_failure: Callable[[BaseException], None] | None = None
) -> Starlette:
    """The application; `on_engine_failure` is called if the engine cannot start (the CLI then exits)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The engine loads in the background: the server answers at once, /health says 503 until it is ready.
        starting = asyncio.create_task(_start_engine(state, on_engine_failure))
        # --tool-server: listed in the background (logged); a response that needs them waits for the listing.
        listing = asyncio.create_task(state.tool_servers.start()) if state.tool_servers.urls else None
        await _open_store(state)
        stop_draining = state.draining.install()
        try:
            yield
        finally:
            stop_draining()
            for task in (starting, listing):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if state.jobs is not None:
                await state.jobs.close()
            await state.engine.close()
            if state.responses is not None:
                await state.responses.close()
            state.metrics.close()

    routes: dict[Callable[..., object], str] = {}  # endpoint -> path template, for the observer's labels
    probes = {"/live", "/health", "/ready"}
    public = frozenset(probes | {"/metrics"} if state.config.metrics_public else probes) | PLAYGROUND_PATHS
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
            WebSocketRoute("/v1/responses", responses_socket),
            Route("/v1/responses/compact", compact_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
            Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
            Route("/v1/conversations", conversations.create_conversation, methods=["POST"]),
            Route("/v1/conversations/{conversation_id}", conversations.retrieve_conversation, methods=["GET"]),
            Route("/v1/conversations/{conversation_id}", conversations.update_conversation, methods=["POST"]),
            Route("/v1/conversations/{conversation_id}", conversations.delete_conversation, methods=["DELETE"]),
            Route("/v1/conversations/{conversation_id}/items", conversations.list_items, methods=["GET"]),
            Route("/v1/conversations/{conversation_id}/items", conversations.add_items, methods=["POST"]),
            Route("/v1/conversations/{conversation_id}/items/{item_id}", conversations.retrieve_item,
                  methods=["GET"]),
            Route("/v1/conversations/{conversation_id}/items/{item_id}", conversations.delete_item,
                  methods=["DELETE"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
            Route("/live", live, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/kv_event_sources", kv_event_sources, methods=["GET"]),
            *PLAYGROUND_ROUTES,
        ],
        exception_handlers={
            APIError: api_error_handler,
            EngineError: engine_error_handler,
            StoreUnavailable: store_unavailable_handler,
            Unstorable: unstorable_handler,
            ClientDisconnected: client_gone_handler,
            HTTPException: http_error_handler,
            Exception: unexpected_error_handler,
        },
        lifespan=lifespan,
        middleware=[
            Middleware(RequestObserver, metrics=state.metrics, model=state.config.served_model_name,
                       routes=routes, log_requests=state.config.log_requests, tracer=state.tracer),
            Middleware(BrowserGuard, hosts=state.config.allowed_hosts, origins=state.config.allowed_origins),
            # Outside the API key check: a browser's preflight carries no Authorization.
            *([Middleware(CORSMiddleware, allow_origins=list(state.config.allowed_origins), allow_methods=["*"],
                          allow_headers=["*"], expose_headers=["x-request-id", "retry-after"], max_age=600)]
              if state.config.allowed_origins else []),
            *([Middleware(APIKeyMiddleware, api_key=state.config.api_key, public=public)]
              if state.config.api_key else []),
        ],
    )
    routes.update({route.endpoint: route.path for route in app.routes if isinstance(route, Route)})
    # Outside even Starlette's outermost middleware, which wraps `send` too: stream frames skip every wrapper.
    app.middleware_stack = KeepRawSend(app.build_middleware_stack())
    app.state.harmony = state
    return app


async def _open_store(state: ServerState) -> None:
    """Connect the store (a database creates or migrates its schema). Background responses left unfinished by a
    server process that is gone will never finish: say so, now and while serving; also watch for cancels from
    other processes (`proxy/responses/transport/jobs.py`)."""
    if state.responses is not None:
        try:
            await state.responses.open()
        except StoreUnavailable as exc:
            logger.error("%s: the server cannot start without its store", exc)
            raise
    if state.jobs is not None:
        await state.jobs.open()


async def _start_engine(state: ServerState, on_failure: Callable[[BaseException], None] | None) -> None:
    try:
        await state.engine.start()
    except Exception as exc:
        logger.exception("the %s engine failed to start", state.engine.name)
        if on_failure is not None:
            on_failure(exc)
        return
    state.metrics.engine_ready(state.engine.ready)
    logger.info("the %s engine is ready, serving %s", state.engine.name, state.config.served_model_name)
    while not state.engine.ready:  # an engine in another process (--workers) says what it takes when it connects
        await asyncio.sleep(0.2)
    window = getattr(state.engine, "context_window", None)
    if window is not None:  # what the built engine takes: advertised, and held to (proxy/options.py)
        state.config = replace(state.config, max_model_len=min(window.total, state.config.max_model_len),
                               max_prompt_len=min(window.prompt, state.config.max_model_len))
