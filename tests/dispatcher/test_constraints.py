"""Output constraints -> each engine's grammar parameter: the exact JSON sent, and that the
simulated engines (which check structural tags as xgrammar 0.2.8 does) accept it. What the tags
make a model write is tested against the simulator, which generates through them
(tests/simengine/test_obeying.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contracts.messages.generate import GenerateRequest, OutputConstraint, ParseSpec, Route, SamplingParams
from services.common.harmony import CALL, RETURN
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.constraints import structural_tag
from services.dispatcher.engines.sglang import generate_body
from services.dispatcher.engines.vllm import completion_body
from services.simengine.grammar import check_structural_tag

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ARGS = {"type": "json_schema", "json_schema": {"type": "object"}}

# the final answer is SCHEMA's JSON: three ways the grammar can start
FINAL_TAG: dict[str, Any] = {
    "type": "structural_tag",
    "format": {
        "type": "or",
        "elements": [
            # at the final answer (vLLM applies grammars to gpt-oss only after its final header)
            {"type": "sequence", "elements": [{"type": "json_schema", "json_schema": SCHEMA}, {"type": "any_text"}]},
            # at the first output token: free Harmony up to a final header (plain or typed), the JSON, stop
            {
                "type": "sequence",
                "elements": [
                    {"type": "const_string", "value": "<|channel|>"},
                    {
                        "type": "triggered_tags",
                        "triggers": ["final<|message|>", "final <|constrain|>"],
                        "tags": [
                            {
                                "type": "tag",
                                "begin": "final<|message|>",
                                "content": {"type": "json_schema", "json_schema": SCHEMA},
                                "end": "",
                            },
                            {
                                "type": "tag",
                                "begin": "final <|constrain|>json<|message|>",
                                "content": {"type": "json_schema", "json_schema": SCHEMA},
                                "end": "",
                            },
                        ],
                        "at_least_one": False,
                        "stop_after_first": True,
                    },
                ],
            },
            # a first message addressed to a tool, recipient first: free
            {"type": "sequence", "elements": [{"type": "const_string", "value": " to="}, {"type": "any_text"}]},
        ],
    },
}

# a call to functions.get_weather is required, JSON object arguments; before it analysis and
# commentary messages only: no final channel anywhere in the free text
TOOL_TAG: dict[str, Any] = {
    "type": "structural_tag",
    "format": {
        "type": "sequence",
        "elements": [
            {
                "type": "or",
                "elements": [
                    {
                        "type": "tag",
                        "begin": "<|channel|>",
                        "content": {
                            "type": "sequence",
                            "elements": [
                                {
                                    "type": "or",
                                    "elements": [
                                        {"type": "const_string", "value": "analysis"},
                                        {"type": "const_string", "value": "commentary"},
                                    ],
                                },
                                {"type": "any_text", "excludes": ["<|channel|>final"]},
                            ],
                        },
                        "end": " to=functions.",
                    },
                    {"type": "const_string", "value": " to=functions."},
                ],
            },
            {
                "type": "or",
                "elements": [
                    {
                        "type": "sequence",
                        "elements": [
                            {"type": "const_string", "value": "get_weather" + header},
                            ARGS,
                            {"type": "any_text"},
                        ],
                    }
                    for header in (
                        " <|constrain|>json<|message|>",
                        "<|constrain|>json<|message|>",
                        " json<|message|>",
                        "<|channel|>commentary <|constrain|>json<|message|>",
                        "<|channel|>commentary json<|message|>",
                    )
                ],
            },
        ],
    },
}


def request(constraint: OutputConstraint | None, **kw: Any) -> GenerateRequest:
    return GenerateRequest(
        generation_id="g1",
        model="openai/gpt-oss-20b",
        prompt_token_ids=[1, 2, 3],
        stop_token_ids=[RETURN, CALL],
        parse=ParseSpec(request_id="g1"),
        route=Route(gateway="g", parser="p"),
        deadline=2e9,
        sampling=SamplingParams(constraint=constraint),
        **kw,
    )


def test_final_schema_tag_is_exact() -> None:
    assert structural_tag(OutputConstraint(final_schema=SCHEMA)) == FINAL_TAG


def test_tool_call_tag_is_exact() -> None:
    assert structural_tag(OutputConstraint(tools=["get_weather"])) == TOOL_TAG


def test_vllm_body_carries_structured_outputs() -> None:
    """vLLM /v1/completions: ``structured_outputs.structural_tag``, a JSON string."""
    body = completion_body(request(OutputConstraint(final_schema=SCHEMA)))
    assert set(body["structured_outputs"]) == {"structural_tag"}
    sent = body["structured_outputs"]["structural_tag"]
    assert isinstance(sent, str) and json.loads(sent) == FINAL_TAG
    assert sent == json.dumps(FINAL_TAG, separators=(",", ":"))
    tools = completion_body(request(OutputConstraint(tools=["get_weather"], final_schema=SCHEMA)))
    assert json.loads(tools["structured_outputs"]["structural_tag"]) == TOOL_TAG  # the call first


def test_sglang_body_carries_structural_tag() -> None:
    """SGLang /generate: ``sampling_params.structural_tag``, a JSON string."""
    sp = generate_body(request(OutputConstraint(tools=["get_weather"])))["sampling_params"]
    assert isinstance(sp["structural_tag"], str) and json.loads(sp["structural_tag"]) == TOOL_TAG
    assert sp["structural_tag"] == json.dumps(TOOL_TAG, separators=(",", ":"))
    assert not {"json_schema", "regex", "ebnf"} & set(sp)


@pytest.mark.parametrize("constraint", [None, OutputConstraint(), OutputConstraint(namespace="docs")])
def test_nothing_to_enforce_sends_no_grammar(constraint: OutputConstraint | None) -> None:
    assert "structured_outputs" not in completion_body(request(constraint))
    assert "structural_tag" not in generate_body(request(constraint))["sampling_params"]


def test_a_resumed_generation_gets_no_grammar() -> None:
    """The engine would start the grammar in the middle of the output."""
    resumed = request(OutputConstraint(final_schema=SCHEMA), resume_tokens=[200005, 35644])
    assert "structured_outputs" not in completion_body(resumed)
    assert "structural_tag" not in generate_body(resumed)["sampling_params"]


@pytest.mark.parametrize("kind", ["openai", "openai-chat"])
def test_text_mode_gets_no_grammar(kind: str) -> None:
    """Text upstreams have the prompt's response format only."""
    _, body = make_adapter(kind).request(request(OutputConstraint(final_schema=SCHEMA, tools=["x"])))
    assert not {"structured_outputs", "structural_tag", "response_format", "guided_json"} & set(body)


@pytest.mark.parametrize(
    "constraint",
    [
        OutputConstraint(final_schema=SCHEMA),
        OutputConstraint(final_schema={"type": "object"}),
        OutputConstraint(tools=["get_weather", "get", "get_weather"]),
        OutputConstraint(tools=["search"], namespace="docs"),
    ],
)
def test_the_engines_take_the_tags(constraint: OutputConstraint) -> None:
    """The simulator's xgrammar rules (the version current vLLM pins) accept every tag."""
    tag = structural_tag(constraint)
    assert tag is not None
    assert check_structural_tag(json.dumps(tag)) == tag
