"""The encoder service: renders conversations into Harmony prompt token ids and passes each
generation on to the dispatchers. The only place that wires the bus and the encoder."""

from __future__ import annotations

import asyncio

from pydantic import TypeAdapter

from contracts.messages.control import Cancel
from contracts.messages.generate import GenerateJob
from contracts.subjects import ENCODER_QUEUE
from services.common.harmony import harmony_encoding
from services.common.runtime import Runtime
from services.encoder.service import Encoder
from services.encoder.settings import Settings

JOB: TypeAdapter[GenerateJob] = TypeAdapter(GenerateJob)
CANCEL: TypeAdapter[Cancel] = TypeAdapter(Cancel)


async def run(settings: Settings, stop: asyncio.Event | None = None, *, ready: asyncio.Event | None = None) -> None:
    harmony_encoding()  # load the vocabulary before taking any work
    async with Runtime.start(settings, "encoder", stop=stop) as rt:
        encoder = Encoder(settings, rt.bus)
        encoder.start_pool()
        try:
            await wire(rt, encoder)
            await rt.serve(ready=ready, drain=encoder.drain)
        finally:
            encoder.close()


async def wire(rt: Runtime, encoder: Encoder) -> None:
    """``encoder`` takes jobs from the encoders' queue group and those sent to it alone (a
    gateway keeping a generation inside a worker), and hears cancels."""
    subjects = rt.settings.subjects
    await rt.bus.subscribe(subjects.cancel, CANCEL, encoder.on_cancel)
    await rt.bus.subscribe(subjects.jobs, JOB, encoder.on_job, queue=ENCODER_QUEUE, takes_work=True, inline=True)
    own = subjects.encoder_jobs(rt.settings.instance_id)
    await rt.bus.subscribe(own, JOB, encoder.on_job, takes_work=True, inline=True)
    rt.load = lambda: encoder.in_flight
