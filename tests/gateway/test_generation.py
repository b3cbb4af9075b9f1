"""A generation across attempts: what the caller sees when an attempt is cut and resumed."""

from __future__ import annotations

import asyncio

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Heartbeat
from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import GenerateJob, GenerationAccepted, ParsedBatch, ParseSpec, SamplingParams
from contracts.messages.items import ItemStatus, MessageItem
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent, Usage
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.heartbeat import Peers
from services.common.wire import Wire
from services.gateway.generation import Generation, GenerationSpec
from services.gateway.generations import Generations


class Owner(Generations):
    """``Generations`` that records the attempts it is asked to send (its bus never connects)."""

    def __init__(self) -> None:
        super().__init__(
            Bus(Wire(["nats://127.0.0.1:1"]), Subjects("unit")),
            Peers(),
            "g1",
            accept_timeout=5.0,
            first_timeout=5.0,
            idle_timeout=5.0,
            max_resumes=3,
        )
        self.attempts: list[GenerateJob] = []

    async def submit(self, generation: Generation) -> None:
        self.attempts.append(generation.job("g1"))

    async def cancel(self, generation_id: str, reason: str = "") -> None:
        pass


def message(text: str, status: ItemStatus = "completed") -> MessageItem:
    return MessageItem(role="assistant", content=text, id="msg_1", channel="final", status=status)


async def test_an_attempt_cut_by_the_engine_leaves_its_item_open_for_the_next() -> None:
    """The parser closes the open message as incomplete when the engine fails; the generation
    is resumed, so that message is not done: the next attempt continues it and closes it."""
    owner = Owner()
    spec = GenerationSpec(EncodeRequest(model="m", items=[]), SamplingParams(), ParseSpec(request_id="r1"))
    gen = Generation(spec, owner, 5.0, 5.0)
    await gen.owner.submit(gen)
    gen.deliver(GenerationAccepted(generation_id=gen.generation_id, dispatcher="d", worker="w", engine="sim"))
    engine_died = Failed(error=BusError(code=ErrorCode.ENGINE_UNAVAILABLE, message="the engine died", retryable=True))
    gen.deliver(
        ParsedBatch(
            generation_id=gen.generation_id,
            offset=0,
            token_ids=[1, 2],
            events=[
                ItemAdded(output_index=0, item=message("", "in_progress")),
                ItemDelta(output_index=0, delta="Hello "),
                ItemDone(output_index=0, item=message("Hello ", "incomplete")),
                engine_died,
            ],
        )
    )
    # the second attempt (its id: request, turn 0, attempt 1) replays the two tokens, then goes on
    gen.deliver(
        ParsedBatch(
            generation_id="r1.0.1",
            offset=0,
            token_ids=[1, 2, 3],
            events=[
                ItemAdded(output_index=0, item=message("", "in_progress")),
                ItemDelta(output_index=0, delta="Hello "),
                ItemDelta(output_index=0, delta="world"),
                ItemDone(output_index=0, item=message("Hello world")),
                Finished(finish_reason="stop", usage=Usage()),
            ],
        )
    )
    seen: list[ParseEvent] = []
    async with asyncio.timeout(5):
        async for batch in gen.batches():
            seen += batch
    assert len(owner.attempts) == 2 and owner.attempts[1].resume_tokens == [1, 2]
    done = [e for e in seen if isinstance(e, ItemDone)]
    assert len(done) == 1 and isinstance(done[0].item, MessageItem) and done[0].item.content == "Hello world"
    assert "".join(e.delta for e in seen if isinstance(e, ItemDelta)) == "Hello world"
    assert isinstance(seen[-1], Finished)


async def test_a_job_goes_to_the_worker_whose_parser_was_chosen() -> None:
    """A parser that is a worker's (an encoder and a dispatcher beat under the same id and
    take work): the job goes to that worker, so the generation stays in one process. Any other
    parser, or a worker that drains or whose engines are down: to the encoders' queue group."""
    owner = Owner()
    for service, instance, draining, ready in [
        *((role, "w1", False, True) for role in ("encoder", "dispatcher", "parser")),
        *((role, "w2", role == "encoder", True) for role in ("encoder", "dispatcher", "parser")),
        *((role, "w3", False, role != "dispatcher") for role in ("encoder", "dispatcher", "parser")),
        ("encoder", "e1", False, True),
        ("parser", "p1", False, True),
    ]:
        beat = Heartbeat(service=service, instance=instance, interval_s=1, draining=draining, ready=ready)
        await owner.peers.observe(beat)
    assert [owner._is_worker(p) for p in ("w1", "w2", "w3", "p1")] == [True, False, False, False]


async def test_a_worker_death_interrupts_only_what_it_holds() -> None:
    """Generations not taken by an engine yet: one sent to a worker is interrupted when that
    worker dies, not when another does; one sent to the encoders' group by any encoder death."""
    owner = Owner()
    spec = GenerationSpec(EncodeRequest(model="m", items=[]), SamplingParams(), ParseSpec(request_id="r"), None)
    on_w1, on_w2, grouped = (Generation(spec, owner, 5.0, 5.0, generation_id=g) for g in ("a", "b", "c"))
    on_w1.sent_to, on_w2.sent_to = "w1", "w2"
    for generation in (on_w1, on_w2, grouped):
        owner._active[generation.generation_id] = generation
    await owner.on_death("encoder", "w1")
    assert [len(g._inbox) for g in (on_w1, on_w2, grouped)] == [1, 0, 1]
