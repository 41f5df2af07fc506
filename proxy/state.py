"""What request handlers share: settings, vocabulary, renderer and engine, held in explicit app state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parsers.render import Renderer
from parsers.vocab import Vocab
from proxy.admission import AdmittedEngine
from proxy.config import ServerConfig
from proxy.draining import Draining
from proxy.engines.base import Engine
from proxy.errors import APIError, model_not_found
from proxy.responses.request.unseal import Unsealer
from proxy.responses.sealing import Sealer, sealer_from
from proxy.responses.transport.jobs import BackgroundJobs
from proxy.responses.turns import TurnMemory
from proxy.server_tools.allow import McpAllowList
from proxy.server_tools.builtin import ToolServers
from proxy.server_tools.tool_cache import ToolListCache
from proxy.store.base import ResponseStore
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import TracedRenderer
from tools.cache import ToolCatalog

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass
class ServerState:
    config: ServerConfig
    vocab: Vocab
    engine: Engine
    responses: ResponseStore | None = None  # None: storage disabled (--no-store)
    metrics: Metrics = None  # type: ignore[assignment]  # None: new ones (the CLI passes the ones it wired up)
    tracer: Tracer | None = None  # OpenTelemetry's, when OTEL_* settings ask for traces (proxy/telemetry/tracing.py)
    renderer: Renderer = field(init=False)
    jobs: BackgroundJobs | None = field(init=False)
    mcp_allow: McpAllowList = field(init=False)  # which client-supplied MCP server URLs may be reached
    tool_servers: ToolServers = field(init=False)  # gpt-oss's built-in tools, run by --tool-server MCP servers
    mcp_tool_lists: ToolListCache = field(init=False, default_factory=ToolListCache)  # across response chains
    sealer: Sealer = field(init=False)  # seals and opens encrypted_content (reasoning, compaction)
    turn_memory: TurnMemory = field(init=False)  # what WebSocket connections remember, all together
    started_at: int = field(default_factory=lambda: int(time.time()))
    draining: Draining = field(init=False)  # SIGTERM: not ready, then shut down (proxy/draining.py)

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = Metrics(self.config.served_model_name, self.engine.name, self.config.max_model_len)
        self.renderer = Renderer(self.vocab, ToolCatalog(self.config.max_tools, self.config.max_tools_schema_bytes))
        if self.tracer is not None:
            self.renderer = TracedRenderer(self.renderer)  # type: ignore[assignment]  # a Renderer, with spans
        self.jobs = BackgroundJobs(self.responses) if self.responses is not None else None
        self.mcp_allow = McpAllowList(self.config.mcp_allow)
        self.tool_servers = ToolServers(self.config.tool_servers)
        self.draining = Draining(self.config.drain_seconds)
        self.sealer = sealer_from(self.config.reasoning_key)
        self.turn_memory = TurnMemory(self.config.ws_turns_memory)

    def unsealer(self) -> Unsealer:
        """What opens one request's blobs: each once, expanding to no more than the context window."""
        return Unsealer(self.sealer, self.config.max_model_len)

    def check_model(self, model: object) -> None:
        if model != self.config.served_model_name:
            raise model_not_found(model, self.config.served_model_name)

    def check_room(self) -> None:
        """A 429 before the body is read, parsed and rendered, when the admission queue is full already."""
        if isinstance(self.engine, AdmittedEngine):
            self.engine.queue.check_room()

    def require_ready(self) -> None:
        if not self.engine.ready:
            raise APIError(
                503, f"The {self.engine.name} engine is still starting; retry shortly.", headers={"Retry-After": "5"}
            )
