"""The request path: per-tool work done once, prompt pieces reused exactly, bounds as 400s, large work off the loop."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.conversation import AssistantMessage, Instructions, Prompt, Reasoning, ToolCall, ToolResult, UserMessage
from parsers.message_tokens import encode_in_pieces
from parsers.render import Renderer
from parsers.vocab import Vocab, load_vocab
from proxy.app import create_app
from proxy.chat.request import _MESSAGE, _REQUEST, parse_chat_request
from proxy.chat.schema import CHAT_REQUEST, MESSAGES
from proxy.config import ServerConfig
from proxy.engines.mock import mock_engine
from proxy.errors import APIError
from proxy.responses.request.parse import parse_responses_request
from proxy.state import ServerState
from proxy.validation import LARGE_BODY_BYTES, compile_schema, decode_json_object
from tests.conftest import FIXTURES, MODEL, LiveServer
from tools.cache import MAX_TOOLS, BoundedCache, ToolCatalog
from tools.definitions import ResponseFormat
from tools.fast_schema import compile_predicate
from tools.schema_check import _ACCEPTS, merged_meta_schema, schema_error

VOCAB = load_vocab()
CHAT = "/v1/chat/completions"
GOLDEN = [json.loads(path.read_text()) for path in sorted((FIXTURES / "prompts").glob("*.request.json"))]


def tool(name: str, properties: int = 3, description: str = "Looks things up.") -> dict[str, Any]:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": f"Field {i}"}
                                               for i in range(properties)}, "required": ["p0"]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def chat_body(tools: list[dict[str, Any]], messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages or [{"role": "user", "content": "hi"}], "tools": tools}


# -- per-tool work is done once -----------------------------------------------------------------------------

def test_a_resent_tool_is_not_checked_again() -> None:
    catalog = ToolCatalog()
    tools = [tool(f"t{i}") for i in range(20)]
    first = parse_chat_request(chat_body(tools), "medium", catalog)
    assert catalog.stats().misses == 20 and catalog.stats().hits == 0
    again = parse_chat_request(json.loads(json.dumps(chat_body(tools))), "medium", catalog)  # new objects, same JSON
    assert catalog.stats().misses == 20 and catalog.stats().hits == 20  # no declaration was checked twice
    assert again.prompt.tools == first.prompt.tools

    changed = copy.deepcopy(tools)
    changed[3]["function"]["description"] = "Something else."
    parse_chat_request(chat_body(changed), "medium", catalog)
    assert catalog.stats().misses == 21  # only the changed declaration


def test_responses_tools_share_the_catalog() -> None:
    catalog = ToolCatalog()
    tools = [{"type": "function", **tool(f"t{i}")["function"]} for i in range(5)]
    for _ in range(3):
        parse_responses_request({"model": MODEL, "input": "hi", "tools": tools}, "medium", MODEL, catalog)
    assert (catalog.stats().misses, catalog.stats().hits) == (5, 10)


def test_an_invalid_tool_is_refused_every_time_with_its_position() -> None:
    catalog = ToolCatalog()
    bad = tool("bad")
    bad["function"]["parameters"] = {"type": "object", "properties": {"a": {"type": "strin"}}}
    for position in (0, 2):
        tools = [tool("x"), tool("y")]
        tools.insert(position, bad)
        with pytest.raises(APIError) as caught:
            parse_chat_request(chat_body(tools), "medium", catalog)
        assert caught.value.param == f"tools[{position}].function.parameters"
        assert "'strin' is not valid under any of the given schemas" in caught.value.message


def test_the_tools_section_renders_once_per_tool_set() -> None:
    renderer = Renderer(VOCAB)
    tools = [tool(f"t{i}") for i in range(20)]
    first = renderer.render(parse_chat_request(chat_body(tools), "medium", renderer.tools).prompt)
    before = renderer.cache_stats()
    messages = [{"role": "user", "content": "a different question"}]
    second = renderer.render(parse_chat_request(chat_body(tools, messages), "medium", renderer.tools).prompt)
    after = renderer.cache_stats()
    assert after.misses - before.misses == 1  # the new user message; the tools section came from the cache
    assert first[: first.index(VOCAB.special.end, 10)] == second[: second.index(VOCAB.special.end, 10)]
    assert second == Renderer(VOCAB, cache_tokens=0).render(
        parse_chat_request(chat_body(tools, messages), "medium").prompt)


def test_the_next_turn_encodes_only_its_new_messages() -> None:
    renderer = Renderer(VOCAB)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q1"}]
    renderer.render(parse_chat_request(chat_body([tool("f")], messages), "medium", renderer.tools).prompt)
    misses = renderer.cache_stats().misses
    messages += [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    tokens = renderer.render(parse_chat_request(chat_body([tool("f")], messages), "medium", renderer.tools).prompt)
    assert renderer.cache_stats().misses - misses == 2
    assert tokens == Renderer(VOCAB, cache_tokens=0).render(parse_chat_request(chat_body([tool("f")], messages),
                                                                               "medium").prompt)


# -- reused pieces give the same tokens -----------------------------------------------------------------------

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
words = st.sampled_from(["the", "word", " ", "\n", "\n\n", "  ", "\t", ".", "Ünï", "日本", "123", "'s", "<|end|>",
                         "x" * 40, "—", "\r\n", " \n", "A", "z"])
names = st.sampled_from(["get_weather", "web-search", "get.x"])
items = st.one_of(
    st.builds(UserMessage, texts), st.builds(Reasoning, texts), st.builds(AssistantMessage, texts, st.booleans()),
    st.builds(ToolCall, st.sampled_from(["c1", "c2"]), names, texts),
    st.builds(ToolResult, st.sampled_from(["c1", "c2"]), names, texts), st.builds(Instructions, texts),
)
functions = st.builds(
    lambda name, description, parameters: parse_chat_request(chat_body([{"type": "function", "function": {
        "name": name, "description": description, "parameters": parameters}}]), "medium").prompt.tools[0],
    names, texts, st.sampled_from([None, {"type": "object", "properties": {"city": {"type": "string"}}}]))
formats = st.one_of(st.none(), st.builds(ResponseFormat, st.just("answer"), st.just({"type": "object"}), texts))


@settings(max_examples=150, deadline=None)
@given(conversation=st.lists(items, max_size=10), tools=st.lists(functions, max_size=3, unique_by=lambda t: t.name),
       response_format=formats, effort=st.sampled_from(["low", "medium", "high"]),
       budget=st.sampled_from([0, 40, 100_000]))
def test_rendering_turn_by_turn_with_reuse_equals_rendering_without(
    conversation: list[Any], tools: list[Any], response_format: Any, effort: str, budget: int
) -> None:
    reusing, plain = Renderer(VOCAB, cache_tokens=budget), Renderer(VOCAB, cache_tokens=0)
    for end in range(len(conversation) + 1):  # each turn sends the conversation so far
        prompt = Prompt(conversation[:end], tools, effort, response_format)
        assert reusing.render(prompt) == plain.render(prompt)
    assert reusing.cache_stats().weight <= budget


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(words, min_size=1, max_size=400), piece_chars=st.sampled_from([1, 7, 64, 300]))
def test_encoding_in_pieces_gives_the_same_tokens(pieces: list[str], piece_chars: int) -> None:
    text = "".join(pieces)
    assert encode_in_pieces(VOCAB, text, piece_chars) == VOCAB.encode(text)


def test_a_long_prompt_rendered_in_a_thread_is_the_same(vocab: Vocab) -> None:
    rng = random.Random(3)
    long_text = " ".join(rng.choice(["alpha", "beta", "gamma\n", "delta.", "Ωmega", "42"]) for _ in range(20_000))
    prompt = Prompt([Instructions("Be exact."), UserMessage(long_text), AssistantMessage("ok"), UserMessage("more")])
    renderer = Renderer(vocab)
    off_loop = asyncio.run(renderer.render_off_loop(prompt))
    assert off_loop == Renderer(vocab, cache_tokens=0).render(prompt)
    assert renderer.cache_stats().entries == 4  # the instructions and the three messages, made in the thread
    many = Prompt([UserMessage(f"message {i}") for i in range(1500)])  # past the item count: all in the thread
    assert asyncio.run(renderer.render_off_loop(many)) == renderer.render(many)


# -- bounds: many distinct tools stay bounded ---------------------------------------------------------------

def test_many_distinct_tools_stay_within_the_cache_bounds() -> None:
    catalog = ToolCatalog(max_entries=50, max_cached_bytes=20_000)
    renderer = Renderer(VOCAB, catalog, cache_tokens=30_000)
    for request in range(30):
        tools = [tool(f"t{request}_{i}", description=f"Tool {request} {i}.") for i in range(20)]
        renderer.render(parse_chat_request(chat_body(tools), "medium", catalog).prompt)
        stats, pieces = catalog.stats(), renderer.cache_stats()
        assert stats.entries <= 50 and stats.weight <= 20_000
        assert pieces.weight <= 30_000 and pieces.entries <= 30_000 // 32
    assert catalog.stats().misses == 600  # every one was new, and checked


def test_the_bounded_cache_evicts_least_recently_used_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(max_entries=3, max_weight=10)
    for key in "abc":
        cache.put(key, ord(key), 3)
    assert cache.get("a") == ord("a")  # a is now the most recent
    cache.put("d", 0, 3)  # weight 12 > 10: the least recent (b) goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put("big", 0, 11)  # heavier than the whole cache: not kept, nothing evicted for it
    assert cache.get("big") is None and cache.stats().entries == 3


# -- bounds over HTTP -----------------------------------------------------------------------------------------

def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60)


def assert_tools_error(response: httpx.Response, code: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "tools", code)


def test_too_many_tools_is_a_400_naming_tools(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    tools = [tool(f"t{i}", properties=1) for i in range(MAX_TOOLS + 1)]
    response = post(server, CHAT, chat_body(tools))
    assert_tools_error(response, "array_above_max_length")
    message = response.json()["error"]["message"]
    assert f"maximum length {MAX_TOOLS}, but got an array with length {MAX_TOOLS + 1}" in message
    flat = [{"type": "function", **t["function"]} for t in tools]
    assert_tools_error(post(server, "/v1/responses", {"model": MODEL, "input": "hi", "tools": flat}),
                       "array_above_max_length")
    assert post(server, CHAT, chat_body(tools[:MAX_TOOLS])).status_code == 200  # exactly the limit is fine
    thousands = [{"type": "not even a function"}] * 5000  # counted before anything else looks at them
    assert_tools_error(post(server, CHAT, chat_body(thousands)), "array_above_max_length")


def test_too_much_tool_schema_is_a_400_naming_tools(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    tools = [tool(f"t{i}", properties=1300) for i in range(20)]  # ~60 KiB of JSON each, 1.2 MiB in all
    response = post(server, CHAT, chat_body(tools))
    assert_tools_error(response, "invalid_value")
    assert "the maximum is 1048576" in response.json()["error"]["message"]
    flat = [{"type": "function", **t["function"]} for t in tools]
    assert_tools_error(post(server, "/v1/responses", {"model": MODEL, "input": "hi", "tools": flat}), "invalid_value")


def test_tool_bounds_are_settings(serve_app: Callable[[Any], LiveServer], vocab: Vocab) -> None:
    state = ServerState(ServerConfig(), vocab, mock_engine(vocab))
    state.renderer = Renderer(vocab, ToolCatalog(max_tools=2, max_schema_bytes=2000))
    server = serve_app(create_app(state))
    assert post(server, CHAT, chat_body([tool("a"), tool("b")])).status_code == 200
    assert_tools_error(post(server, CHAT, chat_body([tool("a"), tool("b"), tool("c")])), "array_above_max_length")
    assert_tools_error(post(server, CHAT, chat_body([tool("a", properties=60)])), "invalid_value")


def test_a_large_body_is_handled_off_the_loop_with_the_same_answers(serve: Callable[..., LiveServer]) -> None:
    server = serve()
    rng = random.Random(5)
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": " ".join(rng.choice(["lorem", "ipsum", "dolor\n", "sit."]) for _ in range(400))}
                for i in range(120)]
    body = chat_body([tool("lookup")], messages)
    assert len(json.dumps(body)) > LARGE_BODY_BYTES
    counted = post(server, "/tokenize", body)
    assert counted.status_code == 200
    expected = Renderer(VOCAB, cache_tokens=0).render(parse_chat_request(body, "medium").prompt)
    assert counted.json()["tokens"] == expected
    assert post(server, CHAT, body).status_code == 200
    broken = httpx.post(server.base_url + CHAT, content=json.dumps(body).encode()[:-1], timeout=60,
                        headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    lone = json.dumps(body).replace('"lorem', '"\\ud800lorem', 1).encode()
    response = httpx.post(server.base_url + CHAT, content=lone, timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "lone surrogate" in response.json()["error"]["message"]


def test_decoding_in_a_thread_gives_the_same_object() -> None:
    raw = json.dumps({"a": [{"b": 1, "b2": [1.5, None, True]}, "x"], "c": {"d": {}}, "e": "\u00e9"}).encode()
    assert decode_json_object(raw, yielding=True) == decode_json_object(raw) == json.loads(raw)


# -- the fast schema predicate never accepts what jsonschema refuses ---------------------------------------

POOL = [None, True, False, 0, 1, -1, 1.5, 2, 3, "", "user", "assistant", "system", "tool", "developer", "text",
        "function", "hi", "object", "string", "(", "^a$", [], {}, ["a"], ["a", "a"], [1], {"type": "text"}]
KEYWORDS_BUT_SCHEMA = sorted(set(merged_meta_schema()["properties"]) - {"$schema"})  # it picks the draft: below


def mutate(value: Any, rng: random.Random, keys: list[str]) -> Any:
    """One random change somewhere in a JSON value: a value replaced, a key removed or added."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        choice = rng.random()
        if choice < 0.2:
            return {k: v for k, v in value.items() if k != key}
        if choice < 0.35:
            return {**value, rng.choice(keys): rng.choice(POOL)}
        if choice < 0.6:
            return {**value, key: copy.deepcopy(rng.choice(POOL))}
        return {**value, key: mutate(value[key], rng, keys)}
    if isinstance(value, list) and value and rng.random() < 0.7:
        index = rng.randrange(len(value))
        return value[:index] + [mutate(value[index], rng, keys)] + value[index + 1 :]
    return copy.deepcopy(rng.choice(POOL))


@pytest.mark.parametrize("seed", range(4))
def test_the_request_predicate_accepts_only_valid_bodies(seed: int) -> None:
    rng = random.Random(seed)
    keys = sorted(CHAT_REQUEST["properties"]) + ["role", "content", "tool_calls", "name", "function", "type"]
    accepted = 0
    for _ in range(1500):
        body = rng.choice(GOLDEN)
        for _ in range(rng.randint(0, 3)):
            body = mutate(body, rng, keys)
        checks = [(_REQUEST, body)]
        messages = body.get("messages") if isinstance(body, dict) else None
        for message in messages if isinstance(messages, list) else []:
            if isinstance(message, dict) and isinstance(message.get("role"), str) and message["role"] in MESSAGES:
                checks.append((_MESSAGE[message["role"]], message))
        for schema, instance in checks:
            if schema.accepts(instance):
                accepted += 1
                assert schema.validator.is_valid(instance), instance
    assert accepted > 500  # the fast path is taken for the valid ones
    assert all(_REQUEST.accepts(body) for body in GOLDEN)


@settings(max_examples=800, deadline=None)
@given(st.recursive(
    st.sampled_from(POOL),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.sampled_from(KEYWORDS_BUT_SCHEMA + ["x"]), children, max_size=4)),
    max_leaves=12))
def test_the_meta_schema_check_agrees_with_jsonschema(schema: Any) -> None:
    if not isinstance(schema, dict):
        return
    expected = _jsonschema_error(schema)
    if _ACCEPTS(schema):
        assert expected is None
    assert schema_error(schema) == expected


def _jsonschema_error(schema: dict[str, Any]) -> str | None:
    """jsonschema's own verdict on a schema: None, or its error message."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message
    return None


TYPICAL_SCHEMAS = [
    tool("x")["function"]["parameters"],
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "enum": [1, 2]},
                                      "s": {"type": "string", "pattern": "^[a-z]+$", "format": "email"},
                                      "a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/p"}]},
                                      "l": {"type": "array", "items": {"type": "number"}, "uniqueItems": True}},
     "$defs": {"p": {"type": "object", "additionalProperties": False}}, "required": ["n"]},
]


@pytest.mark.parametrize("seed", range(3))
def test_the_meta_schema_check_agrees_with_jsonschema_near_typical_schemas(seed: int) -> None:
    rng = random.Random(seed)
    fast = 0
    for _ in range(1000):
        schema = rng.choice(TYPICAL_SCHEMAS)
        for _ in range(rng.randint(1, 3)):
            schema = mutate(schema, rng, KEYWORDS_BUT_SCHEMA)
        if not isinstance(schema, dict):
            continue
        expected = _jsonschema_error(schema)
        if _ACCEPTS(schema):
            fast += 1
            assert expected is None, schema
        assert schema_error(schema) == expected
    assert fast > 50  # valid ones are common enough that the fast path is exercised


def test_the_declared_draft_is_the_one_checked() -> None:
    assert schema_error({"$schema": True}) == "True is not of type 'string'"  # jsonschema itself would crash
    draft7_tuple = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                    "items": [{"type": "string"}]}
    assert schema_error(draft7_tuple) is None  # `items` as a list is draft 7; 2020-12 refuses it
    assert schema_error({k: v for k, v in draft7_tuple.items() if k != "$schema"}) is not None


def test_typical_tool_schemas_take_the_fast_path() -> None:
    schemas = [t["function"]["parameters"] for body in GOLDEN for t in body.get("tools") or []] + TYPICAL_SCHEMAS
    assert len(schemas) > 2 and all(_ACCEPTS(schema) for schema in schemas)


def test_an_unknown_keyword_cannot_be_compiled_by_mistake() -> None:
    with pytest.raises(ValueError, match="not compiled"):
        compile_predicate({"type": "object", "patternProperties": {"^a": {}}})
    assert compile_schema({"type": "object", "required": ["a"]}).accepts({"a": 1})
