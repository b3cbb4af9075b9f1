"""The rules every contract declares: frozen, unknown fields ignored (so peers upgrade one at a
time), wrong tags and mistyped values rejected with the offending field named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from contracts.errors import BusError
from contracts.messages.control import Cancel, Heartbeat
from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import EventFrame, GenerateJob, GenerationFailed, ParsedBatch, TokenBatch
from contracts.messages.items import MessageItem
from contracts.messages.tools import CallToolRequest, McpServer
from tests.contracts import samples
from tests.contracts.samples import SAMPLES, TAGS, all_contract_classes

SAMPLE_LIST = list(SAMPLES.values())
TAGGED = [s for s in SAMPLE_LIST if any(tag in type(s).model_fields for tag in TAGS)]


def name_of(value: object) -> str:
    return type(value).__name__


def as_dict(sample: BaseModel) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sample.model_dump_json())
    return data


CLASSES = sorted(all_contract_classes(), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", CLASSES, ids=[c.__name__ for c in CLASSES])
def test_declared_config(cls: type[BaseModel]) -> None:
    assert cls.model_config.get("frozen") is True
    assert cls.model_config.get("extra") == "ignore"


@pytest.mark.parametrize("sample", SAMPLE_LIST, ids=name_of)
def test_frozen(sample: BaseModel) -> None:
    before = sample.model_dump_json()
    for name in type(sample).model_fields:
        with pytest.raises(ValidationError) as info:
            setattr(sample, name, getattr(sample, name))
        assert info.value.errors()[0]["type"] == "frozen_instance"
    assert sample.model_dump_json() == before


@pytest.mark.parametrize("sample", SAMPLE_LIST, ids=name_of)
def test_unknown_top_level_fields_are_ignored(sample: BaseModel) -> None:
    data = as_dict(sample) | {"added_by_a_newer_peer": {"x": [1]}, "zz": None}
    decoded = type(sample).model_validate_json(json.dumps(data))
    assert decoded == sample
    assert not decoded.model_extra
    assert "added_by_a_newer_peer" not in decoded.model_dump_json()


def test_unknown_nested_fields_are_ignored_inside_models_and_union_members() -> None:
    job = as_dict(samples.generate_job)
    job["route"]["new"] = 1
    job["encode"]["items"][0]["new"] = 1  # a ConversationItem (discriminated union member)
    job["sampling"]["constraint"]["new"] = 1
    assert GenerateJob.model_validate_json(json.dumps(job)) == samples.generate_job

    frame = as_dict(samples.event_frame)
    frame["events"][2]["new"] = 1  # a GatewayEvent
    frame["events"][2]["events"][0]["new"] = 1  # a ParseEvent
    frame["events"][2]["events"][0]["item"]["new"] = 1  # an OutputItem
    frame["events"][1]["error"]["new"] = 1  # a BusError
    assert EventFrame.model_validate_json(json.dumps(frame)) == samples.event_frame


@pytest.mark.parametrize("sample", TAGGED, ids=name_of)
def test_a_wrong_tag_is_rejected(sample: BaseModel) -> None:
    """A message decoded as the wrong type fails on its tag instead of being misread (extra
    fields are ignored, so the tag is what tells ``Cancel`` from any message with a generation_id)."""
    tag = next(t for t in TAGS if t in type(sample).model_fields)
    with pytest.raises(ValidationError) as info:
        type(sample).model_validate_json(json.dumps(as_dict(sample) | {tag: "something_else"}))
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [((tag,), "literal_error")]


def test_a_job_is_not_a_cancel() -> None:
    job = json.dumps(as_dict(samples.generate_job))
    with pytest.raises(ValidationError, match="kind"):
        Cancel.model_validate_json(job)


def test_a_missing_tag_defaults_at_top_level_but_not_inside_a_union() -> None:
    assert Cancel.model_validate_json('{"generation_id": "g"}') == Cancel(generation_id="g")
    with pytest.raises(ValidationError) as info:
        EventFrame.model_validate_json(
            '{"events": [{"generation_id": "g", "dispatcher": "d", "worker": "w", "engine": "sim"}]}'
        )
    assert info.value.errors()[0]["type"] == "union_tag_not_found"


def test_an_unknown_union_tag_is_rejected() -> None:
    frame = as_dict(samples.event_frame)
    frame["events"].append({"kind": "from_the_future", "generation_id": "g"})
    with pytest.raises(ValidationError) as info:
        EventFrame.model_validate_json(json.dumps(frame))
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [(("events", 3), "union_tag_invalid")]


MISTYPED: list[tuple[BaseModel, str, Any, tuple[str | int, ...], str]] = [
    (samples.heartbeat, "interval_s", "soon", ("interval_s",), "float_parsing"),
    (samples.token_batch, "token_ids", [1, "x"], ("token_ids", 1), "int_parsing"),
    (samples.token_batch, "finish_reason", "eos", ("finish_reason",), "literal_error"),
    (samples.parsed_batch, "offset", 1.5, ("offset",), "int_from_float"),
    (samples.generation_failed, "stage", "nowhere", ("stage",), "literal_error"),
    (samples.message_item, "role", "tool", ("role",), "literal_error"),
    (samples.encode_request, "reasoning_effort", "max", ("reasoning_effort",), "literal_error"),
    (samples.bus_error, "code", "teapot", ("code",), "enum"),
    (samples.generate_job, "deadline", None, ("deadline",), "float_type"),
    (samples.call_tool_request, "server", "https://mcp.example", ("server",), "model_type"),
    (samples.mcp_server, "headers", {"Authorization": 1}, ("headers", "Authorization"), "string_type"),
]


@pytest.mark.parametrize(
    ("sample", "field", "value", "loc", "error_type"), MISTYPED, ids=[f"{type(m[0]).__name__}.{m[1]}" for m in MISTYPED]
)
def test_mistyped_values_are_rejected(
    sample: BaseModel, field: str, value: Any, loc: tuple[str | int, ...], error_type: str
) -> None:
    with pytest.raises(ValidationError) as info:
        type(sample).model_validate_json(json.dumps(as_dict(sample) | {field: value}))
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [(loc, error_type)]


@pytest.mark.parametrize(
    ("cls", "data", "missing"),
    [
        (Cancel, {}, {"generation_id"}),
        (Heartbeat, {"service": "parser", "instance": "p1"}, {"interval_s"}),
        (TokenBatch, {"token_ids": [1]}, {"generation_id"}),
        (ParsedBatch, {"generation_id": "g"}, {"offset"}),
        (GenerationFailed, {"generation_id": "g", "stage": "encoder"}, {"error"}),
        (GenerateJob, {"generation_id": "g"}, {"encode", "parse", "route", "deadline"}),
        (MessageItem, {"content": "hi"}, {"role"}),
        (EncodeRequest, {"model": "m"}, {"items"}),
        (
            CallToolRequest,
            {"request_id": "r", "server": {"server_label": "s", "server_url": "u"}},
            {"name", "arguments"},
        ),
        (McpServer, {"server_label": "s"}, {"server_url"}),
        (BusError, {"code": "internal_error"}, {"message"}),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_a_missing_required_field_is_named(cls: type[BaseModel], data: dict[str, Any], missing: set[str]) -> None:
    with pytest.raises(ValidationError) as info:
        cls.model_validate_json(json.dumps(data))
    assert [e["type"] for e in info.value.errors()] == ["missing"] * len(missing)
    assert {e["loc"][0] for e in info.value.errors()} == missing
