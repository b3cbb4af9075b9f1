"""The encoder and a dispatcher in one process (`chorus serve encoder-dispatcher`) over real
NATS, in front of the simulated engine: it beats as both roles, a rendered prompt reaches its
dispatcher without a message on the generate subject, and one rendered while it drains goes
over the bus to another dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import TypeAdapter

from contracts.messages.control import Heartbeat
from contracts.messages.generate import EventFrame, GenerateRequest, GenerationAccepted, TokenFrame
from services.encoder_dispatcher.app import run
from services.encoder_dispatcher.settings import Settings
from services.simengine.app import RunningSim, serving
from services.simengine.settings import Settings as SimSettings
from tests.bus import ByGeneration, Tap, adapter, client, job, running


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


@contextlib.asynccontextmanager
async def fused(nats_url: str, namespace: str, sim: RunningSim, **kw: Any) -> AsyncIterator[Any]:
    settings = Settings(nats_url=nats_url, namespace=namespace, engines=[f"sim={sim.url}"], **kw)
    subjects = settings.subjects
    async with client(nats_url, namespace) as c:
        # every request published for a dispatcher (through the bus, so that a long prompt's
        # claim is fetched from the object store)
        generate: asyncio.Queue[GenerateRequest] = asyncio.Queue()

        async def heard(request: GenerateRequest) -> None:
            generate.put_nowait(request)

        await c.subscribe(subjects.generate, TypeAdapter(GenerateRequest), heard)
        async with (
            Tap(c.nc, subjects.parser_tokens("p1"), adapter(TokenFrame)) as tokens,
            Tap(c.nc, subjects.gateway_events("g1"), adapter(EventFrame)) as events,
            Tap(c.nc, subjects.heartbeat("encoder"), adapter(Heartbeat)) as encoder_beats,
            Tap(c.nc, subjects.heartbeat("dispatcher"), adapter(Heartbeat)) as dispatcher_beats,
            running(run, settings) as stop,
        ):
            yield (
                c,
                settings,
                stop,
                generate,
                ByGeneration(tokens, lambda f: f.batches),
                ByGeneration(events, lambda f: f.events),
                encoder_beats,
                dispatcher_beats,
            )


async def test_a_rendered_prompt_goes_to_the_dispatcher_beside_it(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    async with fused(nats_url, namespace, sim) as (c, settings, _, generate, tokens, events, enc, disp):
        # one process, two roles on the bus, one instance id
        assert (await enc.next()).instance == settings.instance_id
        assert (await disp.next()).instance == settings.instance_id
        g = f"fused-{uuid.uuid4().hex[:8]}"
        await c.publish(c.subjects.jobs, job(g, "Hello [[sim:tokens=20]]"))
        accepted = await events.next(g, 10)
        assert isinstance(accepted, GenerationAccepted), accepted
        assert accepted.dispatcher == settings.instance_id and accepted.worker == sim.url
        batches = [await tokens.next(g, 10)]
        while not batches[-1].done:
            batches.append(await tokens.next(g, 10))
        assert sum(len(b.token_ids) for b in batches) > 20
        # the request never crossed the bus: no message on the generate subject
        assert generate.empty()
        assert sim.recorder.get(g) is not None  # the engine streamed it


async def test_a_prompt_rendered_while_draining_goes_over_the_bus(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    """A long prompt renders in the pool; the process is told to stop meanwhile: its dispatcher
    takes no new work, so the rendered request is published for another dispatcher."""
    async with fused(
        nats_url, namespace, sim, inline_render_chars=1000, context_length=2_000_000, drain_timeout_s=20
    ) as (c, _, stop, generate, _tokens, _events, _enc, _disp):
        g = f"drained-{uuid.uuid4().hex[:8]}"
        text = " ".join(f"word{i % 5000}" for i in range(200_000))  # a render of about a second
        await c.publish(c.subjects.jobs, job(g, text))
        await asyncio.sleep(0.2)  # taken, still rendering
        stop.set()
        request = await asyncio.wait_for(generate.get(), 20)
        assert request.generation_id == g and len(request.prompt_token_ids) > 200_000
