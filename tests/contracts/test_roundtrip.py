"""Every contract survives its JSON (what ``services.common.bus.dump`` publishes and the adapters
decode), and tagged unions decode each member to its own class by its tag."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from contracts.errors import BusError
from contracts.messages.encode import EncodeRequest, NamedToolChoice
from contracts.messages.generate import GatewayEvent, GenerationAccepted, GenerationFailed, ParsedBatch
from contracts.messages.items import (
    CompactionItem,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    MessageItem,
    OutputItem,
    ReasoningItem,
)
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent
from contracts.messages.tools import (
    BUILTIN_URL_SCHEME,
    CallToolReply,
    ListToolsReply,
    McpServer,
    ToolResult,
    ToolsListed,
)
from tests.contracts import samples
from tests.contracts.samples import SAMPLES, TAGS, all_contract_classes

SAMPLE_LIST = list(SAMPLES.values())


def name_of(value: object) -> str:
    return type(value).__name__


def test_every_contract_has_a_sample() -> None:
    """A new contract model gets a sample here, so the tests below cover it."""
    missing = {cls.__name__ for cls in all_contract_classes()} - {cls.__name__ for cls in SAMPLES}
    assert not missing


@pytest.mark.parametrize("sample", SAMPLE_LIST, ids=name_of)
def test_sample_sets_every_field_to_a_non_default(sample: BaseModel) -> None:
    """Otherwise a field that stopped crossing the wire would decode to its default unnoticed."""
    for name, field in type(sample).model_fields.items():
        if name in TAGS:
            continue
        assert name in sample.model_fields_set, name
        if not field.is_required():
            assert getattr(sample, name) != field.get_default(call_default_factory=True), name


@pytest.mark.parametrize("sample", SAMPLE_LIST, ids=name_of)
def test_json_round_trip(sample: BaseModel) -> None:
    raw = sample.model_dump_json()
    decoded = type(sample).model_validate_json(raw)
    assert type(decoded) is type(sample)
    assert decoded == sample
    assert decoded.model_dump_json() == raw  # stable: a relayed message is re-published unchanged


@pytest.mark.parametrize("sample", SAMPLE_LIST, ids=name_of)
def test_json_carries_the_tag(sample: BaseModel) -> None:
    """Discriminated unions need the tag in the JSON even though it has a default."""
    for tag in TAGS:
        field = type(sample).model_fields.get(tag)
        if field is not None:
            assert json.loads(sample.model_dump_json())[tag] == field.default


UNIONS: list[tuple[str, Any, str, dict[str, BaseModel]]] = [
    (
        "ConversationItem",
        ConversationItem,
        "type",
        {
            "message": samples.message_item,
            "reasoning": samples.reasoning_item,
            "function_call": samples.function_call_item,
            "function_call_output": samples.function_call_output_item,
            "mcp_list_tools": samples.mcp_list_tools_item,
            "mcp_call": samples.mcp_call_item,
            "mcp_approval_request": samples.mcp_approval_request_item,
            "mcp_approval_response": samples.mcp_approval_response_item,
            "compaction": samples.compaction_item,
        },
    ),
    (
        "OutputItem",
        OutputItem,
        "type",
        {
            "message": samples.message_item,
            "reasoning": samples.reasoning_item,
            "function_call": samples.function_call_item,
        },
    ),
    (
        "ParseEvent",
        ParseEvent,
        "type",
        {
            "item_added": samples.item_added,
            "item_delta": samples.item_delta,
            "item_done": samples.item_done,
            "finished": samples.finished,
            "failed": samples.failed,
        },
    ),
    (
        "GatewayEvent",
        GatewayEvent,
        "kind",
        {"accepted": samples.generation_accepted, "failed": samples.generation_failed, "parsed": samples.parsed_batch},
    ),
    ("ListToolsReply", ListToolsReply, "kind", {"tools_listed": samples.tools_listed, "error": samples.bus_error}),
    ("CallToolReply", CallToolReply, "kind", {"tool_result": samples.tool_result, "error": samples.bus_error}),
]
MEMBERS = [
    pytest.param(union, tag, member, id=f"{name}-{value}")
    for name, union, tag, members in UNIONS
    for value, member in members.items()
]


@pytest.mark.parametrize(("name", "union", "tag", "members"), UNIONS, ids=[u[0] for u in UNIONS])
def test_union_tags_are_exactly_the_declared_ones(
    name: str, union: Any, tag: str, members: dict[str, BaseModel]
) -> None:
    """Each member's tag value is the one listed; no member was dropped or added silently."""
    schema = TypeAdapter(union).json_schema()
    mapping = schema["discriminator"]["mapping"]
    assert schema["discriminator"]["propertyName"] == tag
    assert set(mapping) == set(members)
    for value, member in members.items():
        assert getattr(member, tag) == value
        assert mapping[value].endswith("/" + type(member).__name__)


@pytest.mark.parametrize(("union", "tag", "member"), MEMBERS)
def test_union_member_decodes_to_its_class(union: Any, tag: str, member: BaseModel) -> None:
    decoded = TypeAdapter(union).validate_json(member.model_dump_json())
    assert type(decoded) is type(member)
    assert decoded == member


def test_containers_keep_each_members_class_in_order() -> None:
    job = type(samples.generate_job).model_validate_json(samples.generate_job.model_dump_json())
    assert [type(i) for i in job.encode.items] == [
        MessageItem,
        ReasoningItem,
        FunctionCallItem,
        FunctionCallOutputItem,
        McpListToolsItem,
        McpCallItem,
        McpApprovalRequestItem,
        McpApprovalResponseItem,
        CompactionItem,
    ]
    frame = type(samples.event_frame).model_validate_json(samples.event_frame.model_dump_json())
    assert [type(e) for e in frame.events] == [GenerationAccepted, GenerationFailed, ParsedBatch]
    parsed = frame.events[2]
    assert isinstance(parsed, ParsedBatch)
    assert [type(e) for e in parsed.events] == [ItemAdded, ItemDelta, ItemDone, Finished, Failed]
    assert [type(e.item) for e in parsed.events if isinstance(e, ItemAdded | ItemDone)] == [
        FunctionCallItem,
        ReasoningItem,
    ]


@pytest.mark.parametrize("choice", ["auto", "none", "required", NamedToolChoice(name="f")], ids=str)
def test_tool_choice_round_trips_as_string_or_named(choice: Any) -> None:
    request = EncodeRequest(model="m", items=[], tool_choice=choice)
    decoded = EncodeRequest.model_validate_json(request.model_dump_json())
    assert type(decoded.tool_choice) is type(choice)
    assert decoded.tool_choice == choice


def test_error_replies_are_not_mistaken_for_results() -> None:
    """The tools service's replies: a ``BusError`` decodes as one, whichever reply is expected,
    and a tool's own failure stays a ``ToolResult``."""
    error_json = samples.bus_error.model_dump_json()
    assert type(TypeAdapter(ListToolsReply).validate_json(error_json)) is BusError
    assert type(TypeAdapter(CallToolReply).validate_json(error_json)) is BusError
    result: object = TypeAdapter(CallToolReply).validate_json(ToolResult(error="tool failed").model_dump_json())
    assert type(result) is ToolResult
    listed: object = TypeAdapter(ListToolsReply).validate_json(
        ToolsListed(server_label="s", tools=[]).model_dump_json()
    )
    assert type(listed) is ToolsListed


@pytest.mark.parametrize(("label", "expected_label"), [(None, "python"), ("py", "py")])
def test_builtin_server_reference(label: str | None, expected_label: str) -> None:
    server = McpServer.builtin("python", label)
    assert server.server_url == f"{BUILTIN_URL_SCHEME}python" == "builtin:python"
    assert server.server_label == expected_label
    assert McpServer.model_validate_json(server.model_dump_json()) == server
