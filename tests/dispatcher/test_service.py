"""The dispatcher service over real NATS, as a service: draining and stopping with streams in
hand, many concurrent requests, and garbage on the bus."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from contracts.errors import ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.generate import TokenFrame
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.bus import generate_request
from tests.dispatcher.stack import ENC, SLOW, check_stream, dispatcher, ids, new_id
from tests.simengine.prompts import user_prompt


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


async def test_stop_ends_streams_in_hand_as_retryable(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """Draining waits for streams in hand up to drain_timeout_s; what is left then ends with
    a retryable error (the gateway continues it elsewhere) and is aborted in the engine."""
    g = new_id("stop")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"], drain_timeout_s=0.3) as d:
        await d.send(generate_request(g, user_prompt(SLOW)))
        first = await d.tokens.next(g)
        t0 = time.monotonic()
        d.stop.set()
        rest = await d.stream(g)
        waited = time.monotonic() - t0
        await sim.recorder.wait_aborted(g, timeout=5)
    check_stream([first, *rest], g)
    last = rest[-1]
    assert last.finish_reason == "error" and last.error is not None
    assert last.error.code == ErrorCode.SERVICE_UNAVAILABLE and last.error.retryable
    assert waited >= 0.3, waited


async def test_stop_waits_for_streams_in_hand(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """With time enough, draining lets the stream finish normally; peers are told the
    dispatcher drains, then that it stopped."""
    prompt = user_prompt("short [[sim:tokens=100]] [[sim:delay_ms=10]]")  # about 1 s
    g = new_id("drain")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"], drain_timeout_s=20) as d:
        await d.send(generate_request(g, prompt))
        first = await d.tokens.next(g)
        d.stop.set()
        beat = await d.beat()
        while not beat.draining:
            beat = await d.beat()
        assert beat.load == 1  # the stream was in hand when the dispatcher began to drain
        rest = await d.stream(g)
        while not beat.stopping:
            beat = await d.beat()
    batches = [first, *rest]
    check_stream(batches, g)
    assert ids(batches) == plan(prompt, ENC).output_ids
    assert (batches[-1].finish_reason, batches[-1].error) == ("stop", None)


async def test_many_concurrent_requests(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """Every stream complete and in order; while the dispatcher is busy, one frame carries
    the batches of several generations."""
    prompt = user_prompt("bench [[sim:tokens=200]]")
    expected = plan(prompt, ENC).output_ids
    gens = [new_id(f"m{i}") for i in range(100)]
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        for g in gens:
            await d.send(generate_request(g, prompt))
        async with asyncio.timeout(60):
            streams = {g: await d.stream(g, timeout=60) for g in gens}
            accepted = [await d.accepted(g) for g in gens]
    assert all(a.worker == sim.url for a in accepted)
    for g, batches in streams.items():
        check_stream(batches, g)
        assert ids(batches) == expected
        assert batches[-1].finish_reason == "stop"
    assert d.tokens.frames < d.tokens.items, (d.tokens.frames, d.tokens.items)


async def test_garbage_on_the_bus_does_not_stop_the_service(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """Unreadable or wrong-typed messages are dropped (nobody hears of them); the next
    request is served."""
    ok = new_id("ok")
    wrong_type = generate_request(new_id("bad"), user_prompt("hi")).model_dump(mode="json")
    wrong_type["prompt_token_ids"] = "not a list"
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        for payload in (
            b"garbage",
            b"[]",
            b'{"kind": "generate"}',
            Cancel(generation_id=new_id("cancel")).model_dump_json().encode(),
            TokenFrame(batches=[]).model_dump_json().encode(),
        ):
            await d.send(payload)
        await d.send(json.dumps(wrong_type).encode())
        await d.bus.publish(d.bus.subjects.cancel, b"garbage")
        await d.bus.publish(d.bus.subjects.heartbeat("gateway"), b"{}")
        await d.send(generate_request(ok, user_prompt("hi")))
        await d.accepted(ok)
        batches = await d.stream(ok)
    check_stream(batches, ok)
    assert batches[-1].finish_reason == "stop"
    assert set(d.events.of) == {ok} and set(d.tokens.of) == {ok}
