"""What Codex CLI learns about the served model: its catalog entry, answered on `GET /v1/models?client_version=...`.

Codex reads a provider's catalog from `{"models": [ModelInfo, ...]}` beside OpenAI's list (codex-rs
`openai_models.rs`); serde ignores the list's own keys, and the openai SDK ignores `models`. Without an entry
Codex uses fallback metadata: a 272k context window, images offered, `apply_patch` only through the shell.
With this one it knows gpt-oss: the server's context window, text-only input (Codex turns images in tool
outputs into a note before sending them), `apply_patch` as a freeform tool under its Lark grammar, Harmony's
three reasoning efforts, no verbosity control. Codex 0.169 asks only providers with an `auth` command.
"""

from __future__ import annotations

from typing import Any

from proxy.config import ServerConfig

# An entry replaces Codex's base instructions (its own prompt is for its own models): ours, written for gpt-oss
# and the tools Codex declares. A Codex user can still set `model_instructions_file` in Codex's config.
BASE_INSTRUCTIONS = """\
You are a coding agent in the Codex CLI, working in the user's project on their machine. Do what the user asks \
to the end within this turn when you can: look at the code, make the change, check it, then answer.

- Run shell commands with `exec_command` (its `cmd`); read files with `cat`, `sed -n`, `rg` or `ls`. Commands run \
in a sandbox: if one needs more access, say so with `sandbox_permissions` and a short `justification`.
- Edit files with `apply_patch`. Its input is the patch itself, not JSON. A patch looks like this:
  *** Begin Patch
  *** Update File: path/to/file
  @@ a line near the change
   an unchanged line
  -a removed line
  +an added line
  *** End Patch
  `*** Add File: path` is followed by its lines, each starting with `+`; `*** Delete File: path` removes a file. \
Paths are relative to the working folder.
- Keep edits small and in the style of the code around them. Do not revert changes you did not make.
- Before a group of tool calls, tell the user in one short sentence what you are about to do.
- Your final answer is short plain text or Markdown: what you changed or found, and anything the user must do. \
Name files as `path:line`.
"""

EFFORTS = {
    "low": "Fast answers, short reasoning",
    "medium": "Balanced reasoning for everyday tasks",
    "high": "Long reasoning for hard problems",
}


def codex_model_info(config: ServerConfig) -> dict[str, Any]:
    name = config.served_model_name
    return {
        "slug": name,
        "display_name": name,
        "description": "gpt-oss, served by harmony-proxy",
        "default_reasoning_level": config.default_reasoning_effort,
        "supported_reasoning_levels": [{"effort": effort, "description": text} for effort, text in EFFORTS.items()],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 0,
        "upgrade": None,
        "availability_nux": None,
        "base_instructions": BASE_INSTRUCTIONS,
        "supports_reasoning_summaries": True,  # the summary is the reasoning itself, streamed as it is generated
        "default_reasoning_summary": "auto",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",  # a custom tool, its input held to Codex's grammar as generated
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supports_parallel_tool_calls": True,
        "context_window": config.prompt_limit,
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
        "multi_agent_version": "v2",  # sub-agents' messages sealed and opened here (proxy/responses/agent_messages.py)
        "supports_search_tool": False,  # every tool declared up front: MCP tools are not deferred behind a search
        "use_responses_lite": False,  # Lite's tools come as a `functions` namespace, reserved in Harmony
    }
