"""Anthropic Messages API requests -> our models, items and sampling (pure): every block type and
option accepted or refused naming the field, and what Claude Code 2.1 sends."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from anthropic.types.beta import BetaToolParam
from anthropic.types.beta.message_create_params import MessageCreateParamsStreaming
from cryptography.fernet import Fernet

from contracts.errors import ErrorCode
from contracts.messages.encode import NamedToolChoice
from contracts.messages.items import FunctionCallItem, FunctionCallOutputItem, MessageItem, ReasoningItem
from services.common.errors import CallerError
from services.gateway.messages.items import (
    instructions_of,
    messages_to_items,
    offered_tools,
    response_format_of,
    to_encode_request,
    to_sampling,
)
from services.gateway.messages.request import (
    MessagesRequest,
    effort_of,
    parse_request,
    thinking_kept,
    thinking_shown,
    validate_request,
)
from services.gateway.sealing import Sealer

SEALER = Sealer([Fernet.generate_key()])
BASE: dict[str, Any] = {"model": "gpt-oss-120b", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
BILLING = "x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;"


def body(**fields: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **fields}


def refused(data: Any, *, ignore_unknown: bool = False) -> CallerError:
    with pytest.raises(CallerError) as caught:
        validate_request(data, ignore_unknown=ignore_unknown)
    assert caught.value.status_code == 400
    return caught.value


def items_refused(data: dict[str, Any], sealer: Sealer = SEALER) -> CallerError:
    request = validate_request(data)
    with pytest.raises(CallerError) as caught:
        to_encode_request(request, unseal=sealer.open)
    assert caught.value.status_code == 400
    return caught.value


def tool(name: str, **extra: Any) -> dict[str, Any]:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    return {"name": name, "description": f"The {name} tool.", "input_schema": schema, **extra}


def cc_tool(name: str, *, deferred: bool = False, cached: bool = False) -> BetaToolParam:
    """One of Claude Code's tools (its MCP tools are deferred: ``defer_loading``, full schema)."""
    spec = BetaToolParam(name=name, description=f"The {name} tool.", input_schema=dict(tool(name)["input_schema"]))
    if deferred:
        spec["defer_loading"] = True
    if cached:
        spec["cache_control"] = {"type": "ephemeral"}
    return spec


def claude_code_body() -> MessageCreateParamsStreaming:
    """A main-loop request as Claude Code 2.1.x sends it (``POST /v1/messages?beta=true``)."""
    core = ["Task", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "WebFetch", "TodoWrite", "ToolSearch"]
    deferred = ["mcp__github__get_me", "mcp__slack__send_message"]
    return {
        "model": "claude-opus-4-6",
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": "user_5e1c_account__session_0b9a"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "system": [
            {"type": "text", "text": BILLING},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
        ],
        "tools": [cc_tool(n) for n in core]
        + [cc_tool(n, deferred=True, cached=n == deferred[-1]) for n in deferred],  # the last: a cache breakpoint
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nToday's date is 2026-07-01.\n</system-reminder>"},
                    {"type": "text", "text": "What is in this directory?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": SEALER.seal("The user wants a listing.")},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {"role": "system", "content": "Plan mode is active: do not edit files."},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "README.md\nsrc",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }


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


def test_conversation_maps_to_items_in_order() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Find q."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should search.", "signature": SEALER.seal("I should search.")},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "ß"}},
                {"type": "tool_use", "id": "toolu_2", "name": "ToolSearch", "input": {"query": "select:search"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Also look at this."},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "Found:"}, {"type": "tool_reference", "tool_name": "search"}],
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": SEALER.seal("Done thinking.")},
                {"type": "text", "text": "Here it is."},
                {"type": "text", "text": "Anything else?"},
            ],
        },
        {"role": "user", "content": "Thanks"},
    ]
    request = validate_request(body(system="Be brief.", tools=[tool("search"), tool("ToolSearch")], messages=messages))
    assert instructions_of(request) == "Be brief."
    assert messages_to_items(request.messages, SEALER.open) == [
        MessageItem(role="user", content="Find q."),
        ReasoningItem(text="I should search."),
        FunctionCallItem(call_id="toolu_1", name="search", arguments='{"q":"ß"}'),
        FunctionCallItem(call_id="toolu_2", name="ToolSearch", arguments='{"query":"select:search"}'),
        FunctionCallOutputItem(call_id="toolu_1", output="Error: boom"),
        FunctionCallOutputItem(call_id="toolu_2", output="Found:\nLoaded tool: search"),
        MessageItem(role="user", content="Also look at this."),
        ReasoningItem(text="Done thinking."),
        MessageItem(role="assistant", content="Here it is.\n\nAnything else?", channel="final"),
        MessageItem(role="user", content="Thanks"),
    ]


def test_arguments_that_were_not_an_object_come_back_as_written() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"_raw": "[1, 2"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "bad input"}]},
    ]
    items = messages_to_items(validate_request(body(messages=messages)).messages, SEALER.open)
    assert items[1] == FunctionCallItem(call_id="t", name="f", arguments="[1, 2")


def test_system_messages_join_the_instructions_without_the_billing_header() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "First rule."}]},
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Only until the next user turn.", "clear_at": "next_user_message"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "system", "content": "Last rule.", "clear_at": "next_user_message"},
    ]
    request = validate_request(body(system=f"{BILLING}\nBe kind.", messages=messages))
    assert instructions_of(request) == "Be kind.\n\nFirst rule.\n\nLast rule."
    assert instructions_of(validate_request(body(system=[{"type": "text", "text": BILLING}]))) is None
    bad = [{"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}, *messages]
    assert items_refused(body(messages=bad)).error.param == "messages.0.content.0.type"


def test_tool_result_must_answer_an_earlier_tool_use() -> None:
    lonely = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]
    error = items_refused(body(messages=lonely)).error
    assert error.param == "messages.0.content.0.tool_use_id" and "toolu_9" in error.message
    later = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    assert items_refused(body(messages=later)).error.param == "messages.2.content.1.tool_use_id"


def test_blocks_in_the_wrong_role_and_prefill_are_refused() -> None:
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert items_refused(body(messages=[{"role": "user", "content": [use]}])).error.param == "messages.0.content.0.type"
    result = {"type": "tool_result", "tool_use_id": "t"}
    wrong = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [use, result]}, BASE["messages"][0]]
    assert items_refused(body(messages=wrong)).error.param == "messages.1.content.1.type"
    prefill = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "The answer is ("}]
    assert items_refused(body(messages=prefill)).error.param == "messages.1"
    assert items_refused(body(messages=[{"role": "system", "content": "only"}])).error.param == "messages"


def test_thinking_signatures_round_trip_and_tampering_is_refused() -> None:
    sealed = SEALER.seal("The real reasoning.")
    turn: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "an edited text", "signature": sealed}]},
        {"role": "user", "content": "go on"},
    ]
    items = messages_to_items(validate_request(body(messages=turn)).messages, SEALER.open)
    assert items[1] == ReasoningItem(text="The real reasoning.")  # the sealed text, not the plain one

    tampered = copy.deepcopy(turn)
    tampered[1]["content"][0]["signature"] = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    error = items_refused(body(messages=tampered)).error
    assert error.param == "messages.1.content.0.signature" and "not valid" in error.message

    foreign = Sealer([Fernet.generate_key()])  # another server's key
    assert items_refused(body(messages=turn), foreign).error.param == "messages.1.content.0.signature"
    anthropics = copy.deepcopy(turn)
    anthropics[1]["content"][0]["signature"] = "EqQBCkYIBxgCKkBsignaturefromclaude"
    assert items_refused(body(messages=anthropics)).error.param == "messages.1.content.0.signature"
    redacted = copy.deepcopy(turn)
    redacted[1]["content"][0] = {"type": "redacted_thinking", "data": "chorus1.not-a-token"}
    assert items_refused(body(messages=redacted)).error.param == "messages.1.content.0.data"


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


def claude_code_body_dict() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(claude_code_body()))
    return data
