"""The dispatcher service over real NATS, ending generations early: a cancel aborts the
engine request, given-up requests never start, and a gateway that stops or falls silent has its
generations aborted while other gateways' go on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel

from contracts.messages.control import Cancel
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.wire import Wire
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings
from services.simengine.app import RunningSim, serving
from services.simengine.settings import Settings as SimSettings
from tests.bus import generate_request
from tests.dispatcher.stack import SLOW, Stack, check_stream, dispatcher, ids, new_id
from tests.simengine.prompts import user_prompt


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_cancel_aborts_the_engine_request(nats_url: str, namespace: str, sim: RunningSim, kind: str) -> None:
    g = new_id(f"cancel-{kind}")
    async with dispatcher(nats_url, namespace, [f"{kind}={sim.url}"]) as d:
        await d.send(generate_request(g, user_prompt(SLOW)))
        await d.accepted(g)
        first = await d.tokens.next(g)
        assert first.open is not None and not first.done
        await d.cancel(g)
        record = await sim.recorder.wait_aborted(g, timeout=5)
        rest = await d.stream(g)
    assert record.aborted and not record.finished
    if kind == "sglang":
        assert record.abort_requested  # POST /abort_request, not only a closed connection
    check_stream([first, *rest], g)
    last = rest[-1]
    assert (last.finish_reason, last.error) == ("abort", None)
    assert last.usage is not None and last.usage.completion_tokens == len(ids([first, *rest]))


async def test_given_up_requests_are_never_started(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """A cancel heard before the request, or a deadline already past: dropped, the engine
    never sees it, nobody hears of it."""
    early, late, fine = new_id("early"), new_id("late"), new_id("fine")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        await d.cancel(early)
        await d.send(generate_request(early, user_prompt("hi")))
        await d.send(generate_request(late, user_prompt("hi"), deadline_in=-1))
        await d.send(generate_request(fine, user_prompt("hi")))
        await d.accepted(fine)
        assert (await d.stream(fine))[-1].finish_reason == "stop"
    assert sim.recorder.get(early) is None and sim.recorder.get(late) is None
    assert set(d.events.of) == {fine} and set(d.tokens.of) == {fine}


class FakeBus(Bus):
    """A bus whose publish records (its NATS client never connects): what ``Dispatcher.bind``
    needs."""

    def __init__(self, namespace: str) -> None:
        super().__init__(Wire(["nats://127.0.0.1:1"]), Subjects(namespace))
        self.sent: list[tuple[str, BaseModel | bytes]] = []

    async def publish(self, subject: str, msg: BaseModel | bytes, headers: dict[str, str] | None = None) -> None:
        self.sent.append((subject, msg))


async def test_cancel_before_the_stream_task_runs(sim: RunningSim) -> None:
    """A cancel handled right after the request, before its task first ran: the engine never
    sees it, nothing is sent, and the dispatcher does not keep it (load, drain)."""
    g = new_id("quick")
    fake = FakeBus("unit")
    async with Dispatcher(Settings(engines=[f"sim={sim.url}"])) as d:
        d.bind(fake)
        await d.on_generate(generate_request(g, user_prompt(SLOW)))
        assert d.load == 1
        await d.on_cancel(Cancel(generation_id=g))
        await asyncio.wait_for(d.drain(), 2)
        assert d.load == 0 and not d.active
    assert fake.sent == [] and sim.recorder.get(g) is None


async def test_gateway_death_aborts_its_generations(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """g1 says it stops (its last beat): its generations are aborted in the engine at once and
    ended for the parser; g2's goes on."""
    a, b = new_id("of-g1"), new_id("of-g2")
    # only the "stopping" beat can end g1 within this test: a missed beat takes 10 s
    async with dispatcher(nats_url, namespace, [f"vllm={sim.url}"], dead_after_s=10) as d:
        await d.gateway_beat("g1", 10)
        await d.gateway_beat("g2", 10)
        for g, gateway in ((a, "g1"), (b, "g2")):
            await d.send(generate_request(g, user_prompt(SLOW), gateway=gateway))
            assert (await d.tokens.next(g)).open is not None
        await d.gateway_beat("g1", 0.25, stopping=True)
        assert (await sim.recorder.wait_aborted(a, timeout=3)).aborted
        ended = await d.stream(a)
        assert (ended[-1].finish_reason, ended[-1].error) == ("abort", None)
        await still_streaming(d, sim, b)


async def test_silent_gateway_is_counted_dead(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """A gateway whose heartbeats stop: counted dead after gateway_dead_after_s, its generations
    aborted; another gateway's go on."""
    b, c = new_id("of-g2"), new_id("of-g3")
    async with dispatcher(nats_url, namespace, [f"vllm={sim.url}"], gateway_dead_after_s=0.5) as d:
        await d.gateway_beat("g2", 10)  # alive for 30 s
        for g, gateway in ((b, "g2"), (c, "g3")):
            await d.send(generate_request(g, user_prompt(SLOW), gateway=gateway))
            assert (await d.tokens.next(g)).open is not None
        await d.gateway_beat("g3", 0.1)  # and never again: dead after 0.5 s
        assert (await sim.recorder.wait_aborted(c, timeout=5)).aborted
        ended = await d.stream(c)
        assert (ended[-1].finish_reason, ended[-1].error) == ("abort", None)
        await still_streaming(d, sim, b)


async def still_streaming(d: Stack, sim: RunningSim, generation_id: str) -> None:
    """The generation streams on after what was read so far (then it is cancelled)."""
    d.tokens.unread(generation_id)
    more = await d.tokens.next(generation_id)  # sent after every frame read so far
    assert not more.done
    record = sim.recorder.get(generation_id)
    assert record is not None and not record.aborted
    await d.cancel(generation_id)
    assert (await d.stream(generation_id))[-1].finish_reason == "abort"
