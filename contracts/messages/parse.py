"""gateway -> parser: open a session; parser -> gateway: typed events per token batch."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from contracts.errors import BusError
from contracts.messages.base import Contract
from contracts.messages.items import OutputItem


class ParseOpen(Contract):
    kind: Literal["parse_open"] = "parse_open"
    request_id: str
    events_subject: str  # where the parser sends ParsedBatch messages
    tool_names: list[str] = Field(default_factory=list)  # offered function tools (recovery)
    namespaces: list[str] = Field(default_factory=list)  # tool namespaces offered besides functions
    turn: int = 0  # which model turn of the request (tool loops generate several); ids differ per turn
    # JSON schemas of the offered function tools, to repair misnamed arguments
    tool_schemas: dict[str, dict[str, Any]] = Field(default_factory=dict)


class ParseOpened(Contract):
    kind: Literal["parse_opened"] = "parse_opened"
    worker_id: str
    token_subject: str  # where the dispatcher must stream TokenBatch messages


ParseOpenReply = Annotated[ParseOpened | BusError, Field(discriminator="kind")]


class ItemAdded(Contract):
    """A new output item starts (text empty; function calls carry name and call_id)."""

    type: Literal["item_added"] = "item_added"
    output_index: int
    item: OutputItem


class ItemDelta(Contract):
    """Text appended to item ``output_index``: reasoning text, output text or arguments."""

    type: Literal["item_delta"] = "item_delta"
    output_index: int
    delta: str


class ItemDone(Contract):
    type: Literal["item_done"] = "item_done"
    output_index: int
    item: OutputItem


class Usage(Contract):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int | None = None


FinishReason = Literal["stop", "length", "tool_calls", "abort"]


class Finished(Contract):
    type: Literal["finished"] = "finished"
    finish_reason: FinishReason
    usage: Usage
    recoveries: list[str] = Field(default_factory=list)  # kinds of malformed output repaired


class Failed(Contract):
    type: Literal["failed"] = "failed"
    error: BusError
    usage: Usage = Field(default_factory=Usage)


ParseEvent = Annotated[
    ItemAdded | ItemDelta | ItemDone | Finished | Failed,
    Field(discriminator="type"),
]


class ParsedBatch(Contract):
    """Events for one request, in order (``seq`` from 0). Finished or Failed ends it."""

    kind: Literal["parsed"] = "parsed"
    request_id: str
    seq: int
    events: list[ParseEvent]
