"""Server settings that the request handlers read."""

from __future__ import annotations

from dataclasses import dataclass, field

REASONING_FIELDS = ("reasoning_content", "reasoning", "both")  # "both": the same text in each of the two fields
EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str = "openai/gpt-oss-20b"
    reasoning_field: str = "reasoning"  # the field reasoning is sent in (README: the table of clients behind it)
    default_reasoning_effort: str = "medium"
    max_model_len: int = 131072  # gpt-oss context window: prompt plus output tokens
    max_prompt_len: int | None = None  # the longest prompt the engine takes, when less (TensorRT-LLM's max_num_tokens)
    reasoning_summary_events: bool = False  # Responses: also stream reasoning as summary events
    open_responses_events: bool = False  # Responses: name raw reasoning events as the Open Responses spec does
    max_tools: int = 128  # tools one request may declare (OpenAI's limit)
    max_tools_schema_bytes: int = 1024 * 1024  # JSON of all of a request's tools together
    api_key: str | None = None  # when set, /v1 routes need `Authorization: Bearer <api_key>`
    mcp_allow: tuple[str, ...] = ()  # URL prefixes of the MCP servers clients may name (--mcp-allow); none: no MCP
    tool_servers: tuple[str, ...] = ()  # MCP servers providing gpt-oss's browser and python tools (--tool-server)
    max_tool_calls: int = 16  # server-side tool calls one response may run (a request's max_tool_calls may lower it)
    tool_call_timeout: float = 60.0  # seconds one server-side tool call may take before it is cancelled
    metrics_public: bool = False  # /metrics answers without the API key
    drain_seconds: float = 0.0  # on SIGTERM: not ready (/ready 503), serving on this long, then shut down
    log_requests: bool = False  # log each request's body and headers (never its Authorization)
    # Host names requests may give (proxy/browsers.py; "*": any); the CLI adds its bind address and --allowed-hosts
    allowed_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
    allowed_origins: tuple[str, ...] = ()  # browser origins other than the server's own (--allowed-origins; "*": any)
    # The secret sealed blobs (encrypted_content) are keyed from (--reasoning-key); None: a random key per start.
    reasoning_key: str | None = field(default=None, repr=False)
    ws_lifetime: float = 3600.0  # seconds a Responses WebSocket connection lasts (OpenAI's 60 minutes)
    # Bytes the turns of all WebSocket connections may hold (proxy/responses/turns.py; --ws-turns-memory, in MiB)
    ws_turns_memory: int = 1 << 30

    @property
    def prompt_limit(self) -> int:
        """The context advertised to clients (/v1/models, Codex's catalog): the longest prompt the engine takes."""
        return self.max_prompt_len or self.max_model_len
