"""Anthropic Messages API requests -> our request model, tools and sampling (pure): what Claude
Code 2.1 sends accepted, every option accepted or refused naming the field (blocks, tools and
tool choice, thinking and effort, ranges, output format). How the conversation becomes items
is in test_messages_items.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contracts.errors import ErrorCode
from contracts.messages.encode import NamedToolChoice
from contracts.messages.items import FunctionCallItem, FunctionCallOutputItem, MessageItem, ReasoningItem
from services.common.errors import CallerError
from services.gateway.messages.items import offered_tools, response_format_of, to_encode_request, to_sampling
from services.gateway.messages.request import (
    MessagesRequest,
    effort_of,
    parse_request,
    thinking_kept,
    thinking_shown,
    validate_request,
)
from tests.gateway.messages_bodies import BASE, SEALER, body, claude_code_body, claude_code_body_dict, tool

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def refused(data: Any, *, ignore_unknown: bool = False) -> CallerError:
    with pytest.raises(CallerError) as caught:
        validate_request(data, ignore_unknown=ignore_unknown)
    assert caught.value.status_code == 400
    return caught.value


def test_what_claude_code_sends_is_accepted() -> None:
    data: dict[str, Any] = json.loads(json.dumps(claude_code_body()))
    # fields the SDK's types do not know yet, that Claude Code sends: accepted in nested objects
    data["system"][2]["cache_control"]["scope"] = "global"
    data["tools"][0]["eager_input_streaming"] = True
    request = parse_request(json.dumps(data).encode())
    assert request.max_tokens == 32000 and request.stream and len(request.custom_tools) == 12
    assert effort_of(request) == "high"
    assert thinking_kept(request) and not thinking_shown(request)

    encoded = to_encode_request(request, unseal=SEALER.open)
    assert encoded.instructions == (
        "You are Claude Code, Anthropic's official CLI for Claude.\n\n"
        "You are an interactive CLI tool that helps users with software engineering tasks.\n\n"
        "Plan mode is active: do not edit files."
    )
    assert [t.name for t in encoded.tools][-2:] == ["mcp__github__get_me", "mcp__slack__send_message"]
    assert encoded.tools[1].parameters == data["tools"][1]["input_schema"]
    assert encoded.tool_choice == "auto" and encoded.reasoning_effort == "high"
    assert encoded.items == [
        MessageItem(
            role="user",
            content="<system-reminder>\nToday's date is 2026-07-01.\n</system-reminder>\n\nWhat is in this directory?",
        ),
        ReasoningItem(text="The user wants a listing."),
        MessageItem(role="assistant", content="Let me look.", channel="commentary"),
        FunctionCallItem(call_id="toolu_01", name="Bash", arguments='{"command":"ls"}'),
        FunctionCallOutputItem(call_id="toolu_01", output="README.md\nsrc"),
    ]
    sampling = to_sampling(request, None)
    assert sampling.max_tokens == 32000 and sampling.stop == [] and sampling.constraint is None


def test_missing_max_tokens_is_refused_naming_it() -> None:
    data = body()
    del data["max_tokens"]
    error = refused(data).error
    assert (error.param, error.message, error.code) == (
        "max_tokens",
        "max_tokens: Field required",
        ErrorCode.MISSING_REQUIRED_PARAMETER,
    )


def test_unknown_top_level_fields_are_refused_unless_ignored() -> None:
    error = refused(body(reasoning_effort="high")).error
    assert (error.param, error.message) == ("reasoning_effort", "reasoning_effort: Extra inputs are not permitted")
    assert validate_request(body(reasoning_effort="high"), ignore_unknown=True).model == "gpt-oss-120b"


@pytest.mark.parametrize(
    ("content", "param", "words"),
    [
        ([{"type": "image", "source": {"type": "base64", "data": "AA=="}}], "messages.0.content.0.type", "text only"),
        ([{"type": "text", "text": "x"}, {"type": "document", "source": {}}], "messages.0.content.1.type", "text only"),
        (
            [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
            "messages.0.content.0.content.0.type",
            "text only",
        ),
        ([{"type": "server_tool_use", "id": "s", "name": "web_search"}], "messages.0.content.0.type", "server tools"),
        ([{"type": "web_search_tool_result", "tool_use_id": "s"}], "messages.0.content.0.type", "server tools"),
        ([{"type": "hologram"}], "messages.0.content.0.type", "unknown content block type 'hologram'"),
        ([{"text": "no type"}], "messages.0.content.0.type", "Field required"),
        (["bare string"], "messages.0.content.0", "valid dictionary"),
        ([{"type": "tool_result"}], "messages.0.content.0.tool_use_id", "Field required"),
        ([{"type": "tool_use", "id": "t", "name": "f", "input": "[]"}], "messages.0.content.0.input", "dictionary"),
        ([{"type": "thinking", "thinking": "x"}], "messages.0.content.0.signature", "Field required"),
    ],
)
def test_blocks_refused_name_the_field(content: list[Any], param: str, words: str) -> None:
    error = refused(body(messages=[{"role": "user", "content": content}])).error
    assert error.param == param and words in error.message and error.message.startswith(f"{param}: ")


def test_server_tools_and_mcp_servers_are_refused() -> None:
    error = refused(body(tools=[tool("Bash"), {"type": "web_search_20250305", "name": "web_search"}])).error
    assert error.param == "tools.1.type" and "web_search_20250305" in error.message
    assert refused(body(tools=[{"name": "f"}])).error.param == "tools.0.input_schema"
    assert refused(body(tools=[tool("bad name")])).error.param == "tools.0.name"
    assert refused(body(mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}])).error.param == "mcp_servers"
    assert validate_request(body(mcp_servers=[], tools=[tool("f", type="custom", strict=True)])).custom_tools


@pytest.mark.parametrize(
    ("choice", "encoded", "constrained"),
    [
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", None),
        ({"type": "any"}, "required", ["f", "g"]),
        ({"type": "tool", "name": "g", "disable_parallel_tool_use": True}, NamedToolChoice(name="g"), ["g"]),
        ({"type": "none"}, "none", None),
    ],
)
def test_tool_choice(choice: dict[str, Any], encoded: Any, constrained: list[str] | None) -> None:
    request = validate_request(body(tools=[tool("f"), tool("g")], tool_choice=choice))
    assert to_encode_request(request, unseal=SEALER.open).tool_choice == encoded
    constraint = to_sampling(request, None).constraint
    assert (constraint.tools if constraint else None) == constrained
    names, schemas = offered_tools(request)
    assert names == ([] if choice["type"] == "none" else ["f", "g"]) and set(schemas) == set(names)


def test_tool_choice_needs_the_tools_it_names() -> None:
    assert refused(body(tool_choice={"type": "any"})).error.param == "tool_choice"
    error = refused(body(tools=[tool("f")], tool_choice={"type": "tool", "name": "g"})).error
    assert error.param == "tool_choice.name" and "'g'" in error.message
    assert refused(body(tool_choice={"type": "sometimes"})).error.param == "tool_choice"


@pytest.mark.parametrize(
    ("thinking", "output_config", "effort"),
    [
        (None, None, "medium"),
        ({"type": "disabled"}, None, "low"),
        ({"type": "enabled", "budget_tokens": 1024}, None, "low"),
        ({"type": "enabled", "budget_tokens": 4096}, None, "medium"),
        ({"type": "enabled", "budget_tokens": 16383}, None, "medium"),
        ({"type": "enabled", "budget_tokens": 16384}, None, "high"),
        ({"type": "adaptive"}, None, "medium"),
        ({"type": "adaptive"}, {"effort": "low"}, "low"),
        ({"type": "enabled", "budget_tokens": 20000}, {"effort": "medium"}, "medium"),
        ({"type": "disabled"}, {"effort": "high"}, "high"),
        (None, {"effort": "xhigh"}, "high"),
        ({"type": "adaptive", "display": "omitted"}, {"effort": "max"}, "high"),
    ],
)
def test_effort(thinking: dict[str, Any] | None, output_config: dict[str, Any] | None, effort: str) -> None:
    request = validate_request(body(max_tokens=32000, thinking=thinking, output_config=output_config))
    assert effort_of(request) == effort
    assert to_encode_request(request, unseal=SEALER.open).reasoning_effort == effort


@pytest.mark.parametrize(
    ("thinking", "kept", "shown"),
    [
        (None, False, False),
        ({"type": "disabled"}, False, False),
        ({"type": "enabled", "budget_tokens": 2048}, True, True),
        ({"type": "enabled", "budget_tokens": 2048, "display": "omitted"}, True, False),
        ({"type": "adaptive", "display": "summarized"}, True, True),
        ({"type": "adaptive", "display": "omitted"}, True, False),
    ],
)
def test_thinking_display(thinking: dict[str, Any] | None, kept: bool, shown: bool) -> None:
    request = validate_request(body(max_tokens=4096, thinking=thinking))
    assert (thinking_kept(request), thinking_shown(request)) == (kept, shown)


def test_options_out_of_range_are_refused() -> None:
    assert refused(body(thinking={"type": "enabled", "budget_tokens": 512})).error.param == "thinking.budget_tokens"
    error = refused(body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 2048})).error
    assert error.param == "max_tokens" and "budget_tokens" in error.message
    assert refused(body(thinking={"type": "sometimes"})).error.param == "thinking"
    assert refused(body(max_tokens=0)).error.code == ErrorCode.INTEGER_BELOW_MIN_VALUE
    assert refused(body(temperature=1.5)).error.param == "temperature"
    assert refused(body(top_p=0)).error.param == "top_p"
    assert refused(body(top_k=-1)).error.param == "top_k"
    assert refused(body(stop_sequences="END")).error.param == "stop_sequences"
    assert refused(body(messages=[])).error.param == "messages"
    assert refused(body(messages=[{"role": "bot", "content": "x"}])).error.param == "messages.0.role"
    assert refused([BASE]).error.param is None


def test_harmless_options_are_accepted() -> None:
    request = validate_request(
        body(
            temperature=0.0,
            top_p=0.9,
            top_k=40,
            stop_sequences=["END", "\n\nHuman:"],
            metadata={"user_id": "u"},
            service_tier="auto",
            container="container_1",
            context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
            cache_control={"type": "ephemeral"},
            inference_geo="us",
            speed="standard",
        )
    )
    sampling = to_sampling(request, 50)
    assert (sampling.temperature, sampling.top_p, sampling.stop) == (0.0, 0.9, ["END", "\n\nHuman:"])
    assert sampling.max_tokens == 100  # required in this API: the default never applies


def test_structured_output_format() -> None:
    request = validate_request(body(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}))
    fmt = response_format_of(request)
    assert fmt is not None and fmt.json_schema == SCHEMA
    assert to_encode_request(request, unseal=SEALER.open).response_format == fmt
    constraint = to_sampling(request, None).constraint
    assert constraint is not None and constraint.final_schema == SCHEMA
    bad = validate_request(body(output_config={"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}))
    with pytest.raises(CallerError) as caught:
        response_format_of(bad)
    assert caught.value.error.param == "output_config.format.schema"


def test_request_model_is_frozen_and_typed() -> None:
    request = validate_request(claude_code_body_dict())
    assert isinstance(request, MessagesRequest)
    with pytest.raises(ValueError, match="frozen"):
        request.model = "other"
