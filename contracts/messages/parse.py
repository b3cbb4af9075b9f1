"""What the parser makes of a generation's tokens: typed events, in order, that end with
``Finished`` or ``Failed``. They travel to the gateway inside ``ParsedBatch``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from contracts.errors import BusError
from contracts.messages.base import Contract
from contracts.messages.items import OutputItem


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
    stop_sequence: str | None = None  # the caller's stop string that ended the output


class Failed(Contract):
    type: Literal["failed"] = "failed"
    error: BusError
    usage: Usage = Field(default_factory=Usage)


ParseEvent = Annotated[ItemAdded | ItemDelta | ItemDone | Finished | Failed, Field(discriminator="type")]
