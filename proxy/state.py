"""What request handlers share: settings, vocabulary, renderer and engine, held in explicit app state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from parsers.render import Renderer
from parsers.vocab import Vocab
from proxy.config import ServerConfig
from proxy.engines.base import Engine
from proxy.errors import APIError, model_not_found
from proxy.responses.jobs import BackgroundJobs
from proxy.responses.store import ResponseStore
from tools.cache import ToolCatalog


@dataclass
class ServerState:
    config: ServerConfig
    vocab: Vocab
    engine: Engine
    responses: ResponseStore | None = None  # None: storage disabled (--no-store)
    renderer: Renderer = field(init=False)
    jobs: BackgroundJobs | None = field(init=False)
    started_at: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.renderer = Renderer(self.vocab, ToolCatalog(self.config.max_tools, self.config.max_tools_schema_bytes))
        self.jobs = BackgroundJobs(self.responses) if self.responses is not None else None

    def check_model(self, model: object) -> None:
        if model != self.config.served_model_name:
            raise model_not_found(model)

    def require_ready(self) -> None:
        if not self.engine.ready:
            raise APIError(
                503, f"The {self.engine.name} engine is still starting; retry shortly.", headers={"Retry-After": "5"}
            )
