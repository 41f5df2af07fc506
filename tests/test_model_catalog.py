"""`GET /v1/models`: OpenAI's list for every client, and with `client_version` also Codex's catalog entry.

That Codex itself takes the entry (no fallback metadata, apply_patch offered as a freeform tool) is checked
in tests/test_codex.py."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import client_for


def test_the_plain_list_is_openais(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=["<|channel|>final<|message|>hi<|return|>"])
    listed = httpx.get(server.base_url + "/v1/models", timeout=30).json()
    assert set(listed) == {"object", "data"}
    assert [model.id for model in client_for(server).models.list()] == [MODEL]


def test_codex_asks_with_its_version_and_learns_the_model(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=["<|channel|>final<|message|>hi<|return|>"], max_model_len=32768,
                   default_reasoning_effort="low")
    listed = httpx.get(server.base_url + "/v1/models", params={"client_version": "0.169.0"}, timeout=30).json()
    # Still OpenAI's list, for the openai SDK ...
    page = client_for(server).models.list(extra_query={"client_version": "0.169.0"})
    assert [model.id for model in page] == [MODEL] and listed["data"][0]["id"] == MODEL
    # ... and Codex's ModelInfo beside it.
    (entry,) = listed["models"]
    assert entry["slug"] == MODEL and entry["context_window"] == 32768
    assert entry["input_modalities"] == ["text"]
    assert entry["apply_patch_tool_type"] == "freeform"
    assert [level["effort"] for level in entry["supported_reasoning_levels"]] == ["low", "medium", "high"]
    assert entry["default_reasoning_level"] == "low"
    assert entry["support_verbosity"] is False and entry["supports_parallel_tool_calls"] is True
    assert "apply_patch" in entry["base_instructions"] and "exec_command" in entry["base_instructions"]
