"""A generation across attempts: what the caller sees when an attempt is cut and resumed."""

from __future__ import annotations

import asyncio
from typing import Any

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import GenerationAccepted, ParsedBatch, ParseSpec, SamplingParams
from contracts.messages.items import MessageItem
from contracts.messages.parse import (
    Failed,
    Finished,
    ItemAdded,
    ItemDelta,
    ItemDone,
    ParseEvent,
    Usage,
)
from services.gateway.generation import Generation, GenerationSpec


class Owner:
    """Stands in for ``Generations``: records the attempts it is asked to send."""

    max_resumes = 3
    accept_timeout = 5.0

    def __init__(self) -> None:
        self.attempts: list[Any] = []

    async def submit(self, generation: Generation) -> None:
        self.attempts.append(generation.job("g1"))

    async def cancel(self, generation_id: str, reason: str = "") -> None:
        pass


def message(text: str, status: str = "completed") -> MessageItem:
    return MessageItem(role="assistant", content=text, id="msg_1", channel="final", status=status)  # type: ignore[arg-type]


async def test_an_attempt_cut_by_the_engine_leaves_its_item_open_for_the_next() -> None:
    """The parser closes the open message as incomplete when the engine fails; the generation
    is resumed, so that message is not done: the next attempt continues it and closes it."""
    owner = Owner()
    spec = GenerationSpec(EncodeRequest(model="m", items=[]), SamplingParams(), ParseSpec(request_id="r1"))
    gen = Generation(spec, owner, 5.0, 5.0)  # type: ignore[arg-type]
    await gen.owner.submit(gen)
    gen.deliver(GenerationAccepted(generation_id=gen.generation_id, dispatcher="d", worker="w", engine="sim"))
    engine_died = Failed(error=BusError(code=ErrorCode.ENGINE_UNAVAILABLE, message="the engine died", retryable=True))
    gen.deliver(ParsedBatch(generation_id=gen.generation_id, offset=0, token_ids=[1, 2], events=[
        ItemAdded(output_index=0, item=message("", "in_progress")), ItemDelta(output_index=0, delta="Hello "),
        ItemDone(output_index=0, item=message("Hello ", "incomplete")), engine_died]))
    # the second attempt (its id: request, turn 0, attempt 1) replays the two tokens, then goes on
    gen.deliver(ParsedBatch(generation_id="r1.0.1", offset=0, token_ids=[1, 2, 3], events=[
        ItemAdded(output_index=0, item=message("", "in_progress")), ItemDelta(output_index=0, delta="Hello "),
        ItemDelta(output_index=0, delta="world"), ItemDone(output_index=0, item=message("Hello world")),
        Finished(finish_reason="stop", usage=Usage())]))
    seen: list[ParseEvent] = []
    async with asyncio.timeout(5):
        async for batch in gen.batches():
            seen += batch
    assert len(owner.attempts) == 2 and owner.attempts[1].resume_tokens == [1, 2]
    done = [e for e in seen if isinstance(e, ItemDone)]
    assert [d.item.content for d in done] == ["Hello world"]  # type: ignore[union-attr]
    assert "".join(e.delta for e in seen if isinstance(e, ItemDelta)) == "Hello world"
    assert isinstance(seen[-1], Finished)
