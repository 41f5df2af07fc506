"""Tool declarations: openai-harmony's text exactly where it keeps the schema's information, and the information
where it does not (unions, literals, references)."""

from __future__ import annotations

import re
import time
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import DeveloperContent, Message, Role, ToolDescription
from pydantic import BaseModel, Field

from parsers.conversation import Prompt, UserMessage
from parsers.render import Renderer
from parsers.vocab import load_vocab
from tools.cache import ToolDeclarations
from tools.definitions import FunctionTool
from tools.rust_text import json_text, rust_lines
from tools.typescript import declaration, tools_section
from tools.typescript_types import schema_to_typescript

VOCAB = load_vocab()
HEADER = "<|start|>developer<|message|>"


def library_tokens(tools: list[tuple[str, str, Any]]) -> list[int]:
    content = DeveloperContent.new().with_function_tools([ToolDescription.new(*tool) for tool in tools])
    return VOCAB.encoding.render(Message.from_role_and_content(Role.DEVELOPER, content))


def library_section(tools: list[tuple[str, str, Any]]) -> str:
    return VOCAB.decode(library_tokens(tools))[len(HEADER) : -len("<|end|>")]


def library_declaration(schema: Any, description: str = "") -> str:
    """openai-harmony's declaration of one tool `f` taking `schema`."""
    return library_section([("f", description, schema)]).split("{\n\n", 1)[1].removesuffix("\n} // namespace functions")


def our_tokens(tools: list[tuple[str, str, Any]]) -> list[int]:
    return [*VOCAB.encode_harmony(HEADER), *VOCAB.encode(tools_section([declaration(*tool) for tool in tools])),
            VOCAB.special.end]


def declared(schema: Any) -> str:
    """What the model reads for one tool taking `schema`."""
    return declaration("f", "", schema)


# -- the corpus on which openai-harmony loses nothing: our text and tokens are the library's -------------------

line = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12)
any_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


def read_exactly_by_serde_json(number: float) -> bool:
    """serde_json (without `float_roundtrip`, as openai-harmony builds it) reads a float exactly only on its fast
    path: at most 2**53 for the digits, a power of ten up to 22; elsewhere it can be one ulp off, and the library
    then writes a neighbouring float where we write the one sent."""
    mantissa, _, exponent = repr(abs(number)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    return int(whole + fraction) < 2**53 and abs(int(exponent or 0) - len(fraction)) <= 22


numbers = (st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False).filter(read_exactly_by_serde_json))
json_values = st.recursive(
    st.none() | st.booleans() | numbers | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3), max_leaves=5)
annotations = {"description": line, "title": line, "examples": st.lists(line, max_size=2), "default": json_values}
simple_types = st.sampled_from(["string", "number", "integer", "boolean"])


def with_annotations(required: dict[str, Any], nullable: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    optional = {**annotations, "nullable": st.booleans()} if nullable else annotations
    return st.fixed_dictionaries(required, optional=optional)


def objects(values: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(properties: dict[str, Any], required: list[str], description: str | None) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
        return schema if description is None else {**schema, "description": description}
    return st.dictionaries(any_text, values, max_size=3).flatmap(lambda properties: st.builds(
        build, st.just(properties), st.lists(st.sampled_from(sorted(properties) or [""]), unique=True),
        st.none() | line))


def plain_item(schema: dict[str, Any]) -> bool:
    """Not a union (the library writes `"a" | "b"[]` for those) and not nullable (the library drops that)."""
    members = schema.get("type") if isinstance(schema.get("type"), list) else [None]
    return (schema.get("nullable") is not True and "oneOf" not in schema and len(members) == 1
            and len(schema.get("enum", [])) <= 1)


def item_schemas(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    plain = inner.filter(plain_item)
    return st.one_of(plain, objects(inner), st.fixed_dictionaries({"type": st.just("array"), "items": plain})).filter(
        plain_item)


def schemas(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        with_annotations({"type": simple_types}),
        with_annotations({"type": st.just("string"), "enum": st.lists(line, min_size=1, max_size=4)}),
        with_annotations({"type": st.lists(st.sampled_from(["string", "number", "integer", "boolean", "null"]),
                                           min_size=1, max_size=3)}),
        with_annotations({"type": st.just("array")}),
        with_annotations({"type": st.just("array"), "items": item_schemas(inner)}),
        objects(inner),
        with_annotations({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
    )


lossless = st.recursive(with_annotations({"type": simple_types}), schemas, max_leaves=10)
tool_descriptions = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)  # \r, \n included


@settings(max_examples=400, deadline=None)
@given(tools=st.lists(st.tuples(st.sampled_from(["f", "get_weather", "a.b-c"]), tool_descriptions,
                                st.none() | objects(lossless) | lossless), min_size=1, max_size=3))
def test_lossless_schemas_render_as_openai_harmony_token_for_token(tools: list[tuple[str, str, Any]]) -> None:
    assert tools_section([declaration(*tool) for tool in tools]) == library_section(tools)
    assert our_tokens(tools) == library_tokens(tools)


def test_openai_harmonys_own_test_tools_render_as_it_does() -> None:
    """The tools of harmony's test_render_functions_with_parameters (src/tests.rs, test-data/)."""
    tools = [
        ("get_location", "Gets the location of the user.", None),
        ("get_current_weather", "Gets the current weather in the provided location.", {
            "type": "object", "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
            "required": ["location"]}),
        ("kitchensink", "A function with various complex schemas.", {
            "description": "params object", "type": "object", "properties": {
                "string": {"type": "string", "title": "STRING", "description": "A string",
                           "examples": ["hello", "world"]},
                "string_nullable": {"type": "string", "nullable": True, "description": "A nullable string",
                                    "default": "the default"},
                "string_enum": {"type": "string", "enum": ["a", "b", "c"]},
                "oneof_string_or_number": {"oneOf": [{"type": "string", "default": "default_string_in_oneof"},
                                                     {"type": "number", "description": "numbers can happen too"}],
                                           "description": "a oneof", "default": 20}}}),
    ]
    section = tools_section([declaration(*tool) for tool in tools])
    assert section == library_section(tools)
    assert ("oneof_string_or_number?:\n | string // default: \"default_string_in_oneof\"\n"
            " | number // numbers can happen too\n,\n") in section


@pytest.mark.parametrize("number", [0.1, 1e-5, 1e-7, 1.5e300, 1e16, 1e15, 123.456, -0.0, 2**64 - 1, 2**64, -(2**63),
                                    -(2**63) - 1, 10**30, 5e-324])
def test_numbers_are_written_as_serde_json_writes_them(number: float) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number", "default": number}}}
    assert declared(schema) == library_declaration(schema)
    assert json_text(number) in declared(schema)


@pytest.mark.parametrize("text", ["", "a", "a\n", "\n", "a\r", "a\r\nb", "a\rb\n\nc\n", "a\n\r\n"])
def test_description_lines_split_as_rusts_str_lines(text: str) -> None:
    comments = library_declaration(None, text).split("type f = () => any;")[0]
    assert rust_lines(text) == [line.removeprefix("// ") for line in comments.split("\n")[:-1]]


# -- where the library loses information ---------------------------------------------------------------------


def test_anyof_is_written_as_the_library_writes_oneof() -> None:
    union = {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "number"}],
                                                    "description": "A or B", "default": "x"}}}
    assert "a?: any, // default: \"x\"" in library_section([("f", "", union)])  # the library: the union is lost
    one_of = {"type": "object", "properties": {"a": {**union["properties"]["a"], "oneOf": [
        {"type": "string"}, {"type": "number"}]}}}
    del one_of["properties"]["a"]["anyOf"]
    assert declared(union) == declared(one_of) == library_declaration(one_of)
    assert declared(union) == (
        'type f = (_: {\n// A or B\n// default: "x"\na?:\n | string\n | number\n,\n}) => any;\n')
    variants = [{"type": "object", "properties": {"q": {"type": "string"}}}, {"type": "integer", "description": "id"}]
    assert declared({"anyOf": variants}) == library_declaration({"oneOf": variants})  # at the root too


def test_optional_is_written_as_nullable() -> None:
    optional = {"type": "object", "properties": {"age": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                                                         "default": None, "description": "Age in years"}}}
    nullable = {"type": "object", "properties": {"age": {"type": "integer", "nullable": True, "default": None,
                                                         "description": "Age in years"}}}
    assert declared(optional) == declared(nullable) == library_declaration(nullable)
    assert "age?: number | null, // default: null\n" in declared(optional)


@pytest.mark.parametrize(("schema", "library", "ours"), [
    ({"type": "null"}, "any", "null"),
    ({"type": "integer", "enum": [1, 2, 3]}, "number", "1 | 2 | 3"),
    ({"enum": ["a", 1, None, True]}, "any", '"a" | 1 | null | true'),
    ({"const": "fixed"}, "any", '"fixed"'),
    ({"type": "string", "const": "fixed"}, "string", '"fixed"'),
    ({"type": ["array", "null"], "items": {"type": "string"}}, "array | null", "string[] | null"),
    ({"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, '"a" | "b"[]', '("a" | "b")[]'),
    ({"type": "array", "items": {"type": ["string", "number"]}}, "string | number[]", "(string | number)[]"),
    ({"type": "array", "items": {"type": "string", "nullable": True}}, "string[]", "(string | null)[]"),
    ({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, "any[]", "(string | number)[]"),
    ({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "any[]", "(string | null)[]"),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, "{\n    }", "Record<string, number>"),
    ({"type": "object", "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "{\n    }",
     "Record<string, number | string>"),
    ({"properties": {"x": {"type": "string"}}}, "any", "{\n    x?: string,\n    }"),
    ({"items": {"type": "boolean"}}, "any", "boolean[]"),
    ({"allOf": [{"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
                {"properties": {"y": {"type": "integer"}}}]}, "any", "{\n    x: string,\n    y?: number,\n    }"),
])
def test_information_the_library_loses_is_written(schema: dict[str, Any], library: str, ours: str) -> None:
    wrapped = {"type": "object", "properties": {"p": schema}, "required": ["p"]}
    assert f"\np: {library},\n" in library_section([("f", "", wrapped)])
    assert f"\np: {ours},\n" in declared(wrapped)


def test_references_are_inlined_with_the_referring_keywords_over_them() -> None:
    schema = {
        "$defs": {"Point": {"type": "object", "description": "A point", "properties": {
            "x": {"type": "number"}, "next": {"$ref": "#/$defs/Point"}}, "required": ["x"]}},
        "type": "object", "properties": {
            "start": {"$ref": "#/$defs/Point", "description": "Where it starts"},
            "end": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}], "default": None},
            "self": {"$ref": "#"}, "nowhere": {"$ref": "#/$defs/Missing"}, "remote": {"$ref": "https://x/y.json"}},
    }
    point = {"type": "object", "description": "A point", "properties": {"x": {"type": "number"}, "next": {}},
             "required": ["x"]}
    inlined = {"type": "object", "properties": {  # what the library writes once references are inlined by hand
        "start": {**point, "description": "Where it starts"}, "end": {**point, "nullable": True, "default": None},
        "self": {}, "nowhere": {}, "remote": {}}}
    assert declared(schema) == library_declaration(inlined)
    assert "// Where it starts\nstart?:     // Where it starts\n{\n    x: number,\n    next?: any,\n    },\n" in \
        declared(schema)  # a recursive reference is expanded once


def test_pydantic_models_reach_the_model_whole() -> None:
    class Address(BaseModel):
        street: str
        city: str | None = None

    class Person(BaseModel):
        name: str = Field(description="Full name")
        age: int | None = None
        role: Literal["admin", "user"] = "user"
        tags: list[int | str] = []
        address: Address | None = None
        scores: dict[str, float] = {}
        kind: int | str | None = None

    text = declared(Person.model_json_schema())
    assert library_section([("f", "", Person.model_json_schema())]).count("any") == 1 + 4  # `=> any`, 4 lost
    assert text.count("any") == 1  # only the return type
    for fragment in ("age?: number | null, // default: null", 'role?: "admin" | "user", // default: user',
                     "tags?: (number | string)[], // default: []", "    street: string,", "    } | null,",
                     "scores?: Record<string, number>, // default: {}", "kind?:\n | number\n | string\n | null\n,"):
        assert fragment in text


# -- hostile schemas: never raise, bounded work ----------------------------------------------------------------


def test_references_that_fan_out_stay_bounded() -> None:
    defs = {f"D{level}": {"type": "object", "properties": {
        "a": {"$ref": f"#/$defs/D{level + 1}"}, "b": {"$ref": f"#/$defs/D{level + 1}"}}} for level in range(40)}
    defs["D40"] = {"type": "string"}
    started = time.process_time()  # CPU time: a busy machine does not stretch it
    text = schema_to_typescript({"$defs": defs, "$ref": "#/$defs/D0"})
    assert time.process_time() - started < 1
    assert len(text) < 2_000_000 and "any" in text  # 2**40 expansions were cut short


def test_a_large_schema_of_its_own_still_gets_its_references_expanded() -> None:
    properties: dict[str, Any] = {f"p{index}": {"type": "string"} for index in range(5000)}
    properties["last"] = {"$ref": "#/$defs/Point"}
    schema = {"$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}}, "type": "object",
              "properties": properties}
    assert schema_to_typescript(schema).endswith("last?: {\n    x?: number,\n    },\n}")


@settings(max_examples=200, deadline=None)
@given(schema=json_values.filter(lambda value: isinstance(value, dict)) | st.recursive(
    st.dictionaries(st.sampled_from(["type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const", "items",
                                     "properties", "required", "nullable", "additionalProperties", "default"]),
                    json_values | st.sampled_from(["#", "#/properties", "#/anyOf/0", "#/items", "#/allOf/0", "#x"]),
                    max_size=3),
    lambda inner: st.dictionaries(st.sampled_from(["anyOf", "oneOf", "allOf", "items", "properties"]),
                                  st.lists(inner, max_size=3) | inner | st.dictionaries(line, inner, max_size=2)),
    max_leaves=10))
def test_any_json_renders_without_raising(schema: dict[str, Any]) -> None:
    assert declared(schema).startswith("type f = (_: ")


def test_deep_reference_chains_do_not_exhaust_the_stack() -> None:
    defs = {f"D{level}": {"type": "array", "items": {"$ref": f"#/$defs/D{level + 1}"}} for level in range(3000)}
    assert re.fullmatch(r"any(\[\])+", schema_to_typescript({"$defs": defs, "$ref": "#/$defs/D0"}))
    aliases = {f"D{level}": {"$ref": f"#/$defs/D{level + 1}"} for level in range(3000)}
    assert schema_to_typescript({"$defs": aliases, "$ref": "#/$defs/D0"}) == "any"
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        nested = {"allOf": [nested, {"$ref": "#/$defs/D0"}]}
    assert schema_to_typescript({"$defs": aliases, **nested}) in ("string", "any")


# -- caching and the renderer --------------------------------------------------------------------------------


def test_each_declaration_is_written_once_and_reused_in_any_combination() -> None:
    declarations = ToolDeclarations()
    a, b, c = (FunctionTool(name, "d", {"type": "object", "properties": {"x": {"anyOf": [
        {"type": "string"}, {"type": "null"}]}}}) for name in "abc")
    first = declarations.section([a, b])
    second = declarations.section([b, c, a])
    stats = declarations.stats()
    assert (stats.misses, stats.hits, stats.entries) == (3, 2, 3)
    assert first == tools_section([declaration(t.name, t.description, t.parameters) for t in (a, b)])
    assert "type c = (_: {\nx?: string | null,\n}) => any;" in second


def test_the_renderer_writes_union_tools_into_the_prompt() -> None:
    tool = FunctionTool("pick", "Pick one.", {"type": "object", "properties": {
        "choice": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, "required": ["choice"]})
    tokens = Renderer(VOCAB).render(Prompt([UserMessage("hi")], [tool]))
    text = VOCAB.decode(tokens)
    assert "type pick = (_: {\nchoice:\n | string\n | number\n,\n}) => any;" in text
    assert "any;\n\n} // namespace functions<|end|>" in text
