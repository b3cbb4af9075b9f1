"""A worker (`chorus serve worker`: an encoder, a dispatcher and a parser in one process) over
real NATS, in front of the simulated engine: it beats as its three roles under one id, a job
sent to it is rendered, streamed and parsed without a message on the generate or tokens
subjects, and a prompt rendered while it drains goes over the bus to another dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import TypeAdapter

from contracts.messages.control import Heartbeat
from contracts.messages.generate import (
    EventFrame,
    GatewayEvent,
    GenerateRequest,
    GenerationAccepted,
    ParsedBatch,
    TokenFrame,
)
from contracts.messages.parse import Finished
from services.simengine.app import RunningSim, serving
from services.simengine.settings import Settings as SimSettings
from services.worker.app import run
from services.worker.settings import Settings
from tests.bus import ByGeneration, Tap, adapter, client, job, running
from tests.waiting import until

ROLES = ("encoder", "dispatcher", "parser")


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


@dataclass
class Worker:
    bus: Any
    settings: Settings
    stop: asyncio.Event
    generate: asyncio.Queue[GenerateRequest]  # requests published for a dispatcher
    tokens: Tap[TokenFrame]  # frames published to the worker's parser
    events: ByGeneration[GatewayEvent]  # gateway g1
    beats: dict[str, Tap[Heartbeat]]


@contextlib.asynccontextmanager
async def worker(nats_url: str, namespace: str, sim: RunningSim, **kw: Any) -> AsyncIterator[Worker]:
    settings = Settings(nats_url=nats_url, namespace=namespace, engines=[f"sim={sim.url}"], **kw)
    subjects = settings.subjects
    async with client(nats_url, namespace) as c:
        # through the bus's own subscribe, so that a long prompt's claim is fetched
        generate: asyncio.Queue[GenerateRequest] = asyncio.Queue()

        async def heard(request: GenerateRequest) -> None:
            generate.put_nowait(request)

        await c.subscribe(subjects.generate, TypeAdapter(GenerateRequest), heard)
        async with contextlib.AsyncExitStack() as stack:
            tokens = await stack.enter_async_context(
                Tap(c.nc, subjects.parser_tokens(settings.instance_id), adapter(TokenFrame))
            )
            events = await stack.enter_async_context(Tap(c.nc, subjects.gateway_events("g1"), adapter(EventFrame)))
            beats = {
                role: await stack.enter_async_context(Tap(c.nc, subjects.heartbeat(role), adapter(Heartbeat)))
                for role in ROLES
            }
            stop = await stack.enter_async_context(running(run, settings))
            yield Worker(c, settings, stop, generate, tokens, ByGeneration(events, lambda f: f.events), beats)


async def test_a_generation_stays_inside_the_worker(nats_url: str, namespace: str, sim: RunningSim) -> None:
    async with worker(nats_url, namespace, sim) as w:
        me = w.settings.instance_id
        for role in ROLES:  # one process, three roles on the bus, one instance id
            assert (await w.beats[role].next()).instance == me, role
        g = f"worker-{uuid.uuid4().hex[:8]}"
        # what a gateway that chose this worker's parser sends: the job to this worker alone
        await w.bus.publish(w.bus.subjects.encoder_jobs(me), job(g, "Hello [[sim:tokens=20]]", parser=me))
        accepted = await w.events.next(g, 10)
        assert isinstance(accepted, GenerationAccepted), accepted
        assert accepted.dispatcher == me and accepted.worker == sim.url
        parsed: list[ParsedBatch] = []
        while not any(isinstance(e, Finished) for b in parsed for e in b.events):
            event = await w.events.next(g, 10)
            assert isinstance(event, ParsedBatch), event
            parsed.append(event)
        assert {b.parser for b in parsed} == {me}
        assert sum(len(b.token_ids) for b in parsed) > 20
        assert sim.recorder.get(g) is not None  # the engine streamed it
        # neither the rendered request nor the tokens crossed the bus
        assert w.generate.empty() and w.tokens.seen == []


async def test_a_prompt_rendered_while_draining_goes_over_the_bus(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    """A long prompt renders in the pool; the worker is told to stop meanwhile: its dispatcher
    takes no new work, so the rendered request is published for another dispatcher."""
    async with worker(
        nats_url,
        namespace,
        sim,
        inline_render_chars=1000,
        context_length=2_000_000,
        drain_timeout_s=20,
        heartbeat_interval_s=0.05,
    ) as w:
        g = f"drained-{uuid.uuid4().hex[:8]}"
        text = " ".join(f"word{i % 5000}" for i in range(200_000))  # a render of about a second
        await w.bus.publish(w.bus.subjects.jobs, job(g, text))
        # taken, still rendering: the encoder's beats count it in flight
        await until(lambda: any(b.load for b in w.beats["encoder"].seen), 10, "the worker's encoder taking the job")
        w.stop.set()
        request = await asyncio.wait_for(w.generate.get(), 20)
        assert request.generation_id == g and len(request.prompt_token_ids) > 200_000
