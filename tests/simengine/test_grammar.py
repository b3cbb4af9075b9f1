"""The simulator's grammar checks (xgrammar 0.2.8's rules and messages, the version vLLM 0.33.0
pins) and the minimal JSON values it answers with when a schema is asked for."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from services.simengine.grammar import GrammarError, check_structural_tag
from services.simengine.instance import NoInstance, minimal_instance
from services.simengine.prompt import parse_response_format
from services.simengine.script import plan
from tests.simengine.prompts import WEATHER, render, user


def tag(fmt: Any) -> str:
    return json.dumps({"type": "structural_tag", "format": fmt})


ANY = {"type": "any_text"}
JSON = {"type": "json_schema", "json_schema": {"type": "object"}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1]", "Structural tag must be an object"),
        (json.dumps({"type": "grammar", "format": ANY}), 'type must be a string "structural_tag"'),
        (json.dumps({"type": "structural_tag"}), "must have a format field"),
        (tag({"type": "frob", "content": ANY}), "Format type not recognized: frob"),
        (tag({"type": 3}), "Format's type must be a string"),
        (tag({}), "Invalid format: {}"),
        (tag({"type": "const_string"}), "must have a value field with a string"),
        (tag({"type": "any_text", "excludes": "x"}), "excluded_strs field must be an array"),
        (tag({"type": "any_text", "max_chars": -1}), "max_chars in any_text must be a non-negative 32-bit integer"),
        (tag({"type": "json_schema", "json_schema": "{}"}), "object or boolean"),
        (tag({"type": "json_schema", "json_schema": {"type": "frob"}}), "Invalid JSON schema"),
        (tag({"type": "sequence", "elements": []}), "at least one element"),
        (tag({"type": "json_schema", "json_schema": {}, "style": "yaml"}), 'style must be "json"'),
        (
            tag({"type": "tag", "begin": "<a>", "content": ANY, "end": ""}),
            "When the content is unlimited, at least one end string must be non-empty",
        ),
        (tag({"type": "tag", "begin": "<a>", "content": JSON, "end": []}), "end array cannot be empty"),
        (tag({"type": "tag", "begin": "<a>", "content": JSON, "end": 3}), "end field must be a string or array"),
        (tag({"type": "repeat", "min": 2, "max": 1, "content": ANY}), "Repeat min must be <= max"),
        (tag({"type": "token", "token": -1}), "Token ID must be non-negative"),
        (tag({"type": "dispatch", "rules": []}), "TagDispatch format rules must be non-empty"),
        (tag({"type": "triggered_tags", "triggers": [], "tags": []}), "triggers must be non-empty"),
        (
            tag(
                {
                    "type": "triggered_tags",
                    "triggers": ["<f"],
                    "tags": [{"type": "tag", "begin": "<g>", "content": JSON, "end": ""}],
                }
            ),
            "does not match any trigger",
        ),
        (
            tag(
                {
                    "type": "triggered_tags",
                    "triggers": ["<f", "<fu"],
                    "tags": [{"type": "tag", "begin": "<fun>", "content": JSON, "end": ""}],
                }
            ),
            "matches multiple triggers",
        ),
        (
            tag(
                {
                    "type": "triggered_tags",
                    "triggers": ["<f"],
                    "tags": [{"type": "tag", "begin": "<f>", "content": JSON, "end": ""}],
                    "at_least_one": "yes",
                }
            ),
            "must be a boolean",
        ),
        (
            tag({"type": "tags_with_separator", "tags": [{"begin": "<f>", "content": JSON, "end": ""}]}),
            "separator field must be a string",
        ),
        (tag({"type": "regex", "pattern": "(unclosed"}), "Invalid regex"),
    ],
)
def test_structural_tags_xgrammar_refuses(text: str, message: str) -> None:
    with pytest.raises(GrammarError, match=message.replace("(", r"\(")):
        check_structural_tag(text)


def test_structural_tags_xgrammar_takes() -> None:
    # vLLM's own gpt-oss reasoning tag (vllm/reasoning/gptoss_reasoning_parser.py)
    vllm_tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "tags": [{"begin": "<|channel|>analysis<|message|>", "content": {"type": "any_text"}, "end": "<|end|>"}],
            "triggers": ["<|channel|>analysis"],
            "stop_after_first": False,
        },
    }
    assert check_structural_tag(json.dumps(vllm_tag)) == vllm_tag
    legacy = {"structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f"]}
    assert check_structural_tag(json.dumps(legacy))["triggers"] == ["<f"]
    # what xgrammar 0.1.30-0.2.8 added: any_text excludes (an excluded content may end a tag with
    # ""), unlimited formats anywhere in a sequence or an or, empty strings, lists of ends
    for fmt in [
        {"type": "any_text", "excludes": ["<|channel|>final"], "max_chars": 10},
        {"type": "sequence", "elements": [ANY, JSON]},
        {"type": "or", "elements": [ANY, JSON]},
        {"type": "const_string", "value": ""},
        {"type": "tag", "begin": "<a>", "content": {"type": "any_text", "excludes": ["x"]}, "end": ""},
        {"type": "tag", "begin": "<a>", "content": JSON, "end": ["</a>", ""]},
        {"type": "tags_with_separator", "tags": [{"begin": "<f>", "content": JSON, "end": ""}], "separator": ""},
        {"type": "optional", "content": ANY},
        {"excludes": []},  # no type: the first format its fields parse as (any_text)
    ]:
        check_structural_tag(tag(fmt))


SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {},
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "hot": {"type": "boolean"},
            "note": {"type": ["string", "null"]},
        },
        "required": ["city", "days", "hot", "note"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 2}},
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 5, "maximum": 9},
            "x": {"type": "number", "exclusiveMinimum": 0.5},
            "m": {"type": "integer", "exclusiveMinimum": 3, "multipleOf": 5},
        },
        "required": ["n", "x", "m"],
    },
    {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b"]},
            "v": {"const": 3},
            "when": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["kind", "v", "when", "id"],
    },
    {
        "$defs": {
            "step": {
                "type": "object",
                "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
                "required": ["explanation", "output"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1},
            "final_answer": {"type": "string"},
        },
        "required": ["steps", "final_answer"],
        "additionalProperties": False,
    },
    {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"type": "string"}]},
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "number"}}, "required": ["b"]},
        ]
    },
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2},
    {"type": "string", "minLength": 3},
    {"type": "integer", "minimum": -4, "maximum": -2},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_minimal_instances_conform(schema: dict[str, Any]) -> None:
    value = minimal_instance(schema)
    jsonschema.validate(value, schema)
    json.dumps(value)  # JSON, nothing else


def test_minimal_instance_of_required_only() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["b"]}
    assert minimal_instance(schema) == {"b": 0}
    with pytest.raises(NoInstance):
        minimal_instance(False)


def test_the_prompt_response_format_is_followed() -> None:
    """Without a grammar, the simulated model answers in the prompt's response format."""
    from openai_harmony import DeveloperContent, Message, Role

    from services.common.harmony import harmony_encoding

    enc = harmony_encoding()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    section = f"# Response Formats\n\n## verdict\n\n// yes or no\n{json.dumps(schema)}"
    assert parse_response_format(f"# Instructions\n\nBe brief.\n\n{section}") == schema
    dev = Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(section))
    prompt = render(dev, user("Is it?"))
    text = enc.decode(plan(prompt, enc).output_ids)
    assert text.endswith('<|channel|>final<|message|>{"ok": false}<|return|>')
    plain = enc.decode(plan(render(user("Is it?"), tools=[WEATHER]), enc).output_ids)
    assert "to=functions.get_weather" in plain  # a tool, no format: a call as before
