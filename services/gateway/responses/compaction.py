"""Compaction: the model condenses a conversation into a summary that Chorus seals into a
``compaction`` item, the same way it seals reasoning (``POST /v1/responses/compact``, and
``context_management`` on create when the prompt passes its threshold).

A compacted conversation is every user message, then the compaction item: the user's words
stay verbatim, the rest (answers, reasoning, tool calls and results) is the summary. Sent back
(over HTTP or a WebSocket, with or without ``previous_response_id``) the item is opened and its
summary rendered into the developer message as context."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import ParseSpec, SamplingParams
from contracts.messages.items import CompactionItem, ConversationItem, MessageItem
from contracts.messages.parse import Failed, Finished, ItemDone, Usage
from services.common.errors import ChorusError, model_behavior
from services.common.tokens import conversation_chars
from services.gateway.context import GatewayContext
from services.gateway.errors import invalid
from services.gateway.generation import Generation, GenerationSpec
from services.gateway.request_base import ApiRequest
from services.gateway.responses.history import Continuations, load_context, referenced
from services.gateway.responses.inputs import InputItem, Text
from services.gateway.responses.items import Unseal, input_item, input_items, new_id, output_item
from services.gateway.responses.request import ReasoningParam
from services.gateway.responses.response import usage_of

SUMMARY_MAX_TOKENS = 4096
CHARS_PER_TOKEN = 4  # what the threshold check assumes of text it has not seen tokenized
INSTRUCTION = (
    "Compact the conversation above into a summary you will read instead of it. Keep every "
    "fact, decision, constraint and open task, the names, numbers, paths and identifiers that "
    "matter, what each tool call found, and where the work stands. Leave out pleasantries and "
    "anything already superseded. Write the summary only, as plain text, with no preamble."
)


class CompactRequest(ApiRequest):
    """``POST /v1/responses/compact`` (openai.types.responses.ResponseCompactParams)."""

    harmless: ClassVar[frozenset[str]] = frozenset(
        {"prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "service_tier", "image"}
    )

    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    input: Text | Annotated[list[InputItem], Field(max_length=100_000)] | None = None
    instructions: Text | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningParam | None = None
    prompt_cache_key: Annotated[str, Field(max_length=512)] | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    image: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _required(self) -> CompactRequest:
        if not self.model:
            raise invalid("Missing required parameter: 'model'.", "model")
        if self.input is None and not self.previous_response_id:
            raise invalid("Missing required parameter: 'input' (or 'previous_response_id').", "input")
        return self


def compacted(items: list[ConversationItem], item: CompactionItem) -> list[ConversationItem]:
    """The user's messages, then the compaction item that stands for everything else."""
    users = [i for i in items if isinstance(i, MessageItem) and i.role == "user"]
    return [*users, item]


def visible(items: list[ConversationItem]) -> list[ConversationItem]:
    """What the model reads: before the last compaction item only the user's messages (the
    item's summary stands for the rest)."""
    for last in range(len(items) - 1, -1, -1):
        item = items[last]
        if isinstance(item, CompactionItem):
            return [*compacted(items[:last], item), *items[last + 1 :]]
    return items


def estimated_tokens(items: list[ConversationItem], instructions: str | None) -> int:
    """About how many tokens the conversation renders to (for ``compact_threshold``)."""
    frames = 16 * len(items)  # each message's header and terminator
    return (len(instructions or "") + conversation_chars(items) + frames) // CHARS_PER_TOKEN


@contextlib.asynccontextmanager
async def summary_generation(
    ctx: GatewayContext,
    *,
    model: str,
    items: list[ConversationItem],
    instructions: str | None,
    request_id: str,
    trace: dict[str, str] | None = None,
) -> AsyncIterator[Generation]:
    """The model turn that writes the summary of ``items``, started: a conversation the model
    cannot take (too long) raises here, before a caller has been sent anything."""
    encode = EncodeRequest(
        model=model,
        instructions=instructions,
        reasoning_effort="low",
        items=[*items, MessageItem(role="user", content=INSTRUCTION)],
    )
    spec = GenerationSpec(
        encode, SamplingParams(max_tokens=SUMMARY_MAX_TOKENS), ParseSpec(request_id=request_id), trace
    )
    async with ctx.generations.open(spec) as generation:
        yield generation


async def read_summary(generation: Generation) -> tuple[str, Usage]:
    """The summary a ``summary_generation`` writes, and its usage."""
    answer: list[str] = []
    usage = Usage()
    async for batch in generation.batches():
        for event in batch:
            if isinstance(event, ItemDone) and isinstance(event.item, MessageItem):
                answer.append(event.item.content)
            elif isinstance(event, Finished):
                usage = event.usage
            elif isinstance(event, Failed):
                raise ChorusError.of(event.error)
    summary = "\n\n".join(a.strip() for a in answer if a.strip())
    if not summary:
        raise model_behavior("The model wrote no summary of this conversation; try again.")
    return summary, usage


async def compact(
    ctx: GatewayContext, req: CompactRequest, store: Continuations, *, unseal: Unseal | None, seal: Any
) -> dict[str, Any]:
    """``POST /v1/responses/compact``: the conversation, condensed (a ``CompactedResponse``;
    its user messages are input messages, which openai-python's output union cannot type)."""
    assert req.model is not None
    ctx.check_model(req.model)
    context = await load_context(store, req.previous_response_id)
    items = [*context, *input_items(req.input, await referenced(store, req.input), unseal)]
    compaction_id = new_id("cmp")
    async with summary_generation(
        ctx, model=req.model, items=items, instructions=req.instructions, request_id=compaction_id
    ) as generation:
        summary, usage = await read_summary(generation)
    item = CompactionItem(summary=summary, id=compaction_id, sealed=seal(summary))
    *users, last = compacted(items, item)
    return {
        "id": compaction_id,
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [
            *(input_item(u).model_dump(mode="json", exclude_none=True) for u in users),
            output_item(last).model_dump(mode="json", exclude_none=True),
        ],
        "usage": usage_of(usage),
    }
