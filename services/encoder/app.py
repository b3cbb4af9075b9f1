"""The encoder service: renders conversations into Harmony prompt token ids and passes each
generation on to the dispatchers. The only place that wires the bus and the encoder."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import TypeAdapter, ValidationError

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.encode import CountRequest, TokenCount
from contracts.messages.generate import GenerateJob
from contracts.subjects import ENCODER_QUEUE
from services.common.harmony import harmony_encoding
from services.common.runtime import Runtime
from services.encoder.render import RenderError
from services.encoder.service import Encoder, Forward
from services.encoder.settings import Settings

JOB: TypeAdapter[GenerateJob] = TypeAdapter(GenerateJob)
CANCEL: TypeAdapter[Cancel] = TypeAdapter(Cancel)
log = logging.getLogger("chorus.encoder")
POOL_START_TIMEOUT_S = 60.0


async def run(settings: Settings, stop: asyncio.Event | None = None, *, ready: asyncio.Event | None = None) -> None:
    harmony_encoding()  # load the vocabulary before taking any work
    async with Runtime.start(settings, "encoder", stop=stop) as rt, role(rt, settings) as encoder:
        await rt.serve(ready=ready, drain=encoder.drain)


@contextlib.asynccontextmanager
async def role(rt: Runtime, settings: Settings, *, forward: Forward | None = None) -> AsyncIterator[Encoder]:
    """The encoder role on ``rt``: made (its render pool started), wired to the bus, and closed
    on the way out. ``forward``: see ``Encoder``."""
    encoder = Encoder(settings, rt.bus, forward=forward)
    encoder.start_pool()
    try:
        await encoder.pool_warm(POOL_START_TIMEOUT_S)  # jobs taken once long prompts can render
        await wire(rt, encoder)
        yield encoder
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
    await rt.bus.nc.subscribe(subjects.encoder_count, queue=ENCODER_QUEUE, cb=functools.partial(count, rt, encoder))
    rt.load = lambda: encoder.in_flight


async def count(rt: Runtime, encoder: Encoder, msg: Any) -> None:
    """A ``CountRequest``: the prompt's token count, or the caller's mistake, as the reply."""
    if not msg.reply:
        return
    reply: BusError | TokenCount
    try:
        request = CountRequest.model_validate_json(await rt.bus.payload(msg))
        reply = TokenCount(tokens=await encoder.count(request.encode))
    except ValidationError as exc:
        reply = BusError(code=ErrorCode.INVALID_REQUEST, message=f"unreadable count request: {str(exc)[:200]}")
    except RenderError as exc:
        reply = exc.error
    except Exception:  # an answer either way: the gateway waits for it
        log.exception("counting a prompt's tokens failed")
        reply = BusError(code=ErrorCode.INTERNAL, message="counting the prompt's tokens failed")
    with contextlib.suppress(Exception):
        await rt.bus.publish(msg.reply, reply)
