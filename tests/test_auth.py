"""`--api-key`: the Authorization scheme in any case (RFC 9110 section 11.1), the key exactly."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from tests.conftest import MODEL, LiveServer
from tests.test_e2e_chat import ANSWER

KEY = "sk-local-0123"


@pytest.mark.parametrize("authorization", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", f"bEaReR {KEY}",
                                           f"Bearer  {KEY}"])
def test_the_bearer_scheme_is_case_insensitive(serve: Callable[..., LiveServer], authorization: str) -> None:
    server = serve(completions=[ANSWER], api_key=KEY)
    response = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                          headers={"authorization": authorization},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("authorization", [None, KEY, f"Basic {KEY}", f"Token {KEY}", f"Bearer{KEY}",
                                           f"Bearer {KEY.upper()}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer",
                                           f"Bearer {KEY} {KEY}"])
def test_anything_but_the_key_is_refused(serve: Callable[..., LiveServer], authorization: str | None) -> None:
    server = serve(completions=[ANSWER], api_key=KEY)
    headers = {} if authorization is None else {"authorization": authorization}
    response = httpx.get(server.base_url + "/v1/models", timeout=30, headers=headers)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_the_openai_sdk_and_health_probes(serve: Callable[..., LiveServer]) -> None:
    server = serve(completions=[ANSWER], api_key=KEY)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert [model.id for model in client.models.list()] == [MODEL]
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200
