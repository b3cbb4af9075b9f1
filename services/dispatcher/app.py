"""The dispatcher service: the only place that wires the bus, the engine client and the
dispatcher together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from pydantic import TypeAdapter

from contracts.messages.control import Cancel
from contracts.messages.generate import GenerateRequest, TokenFrame
from contracts.subjects import DISPATCHER_QUEUE
from services.common.runtime import Runtime
from services.dispatcher.fleet import SelectionPolicy
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings

log = logging.getLogger("chorus.dispatcher")

GENERATE: TypeAdapter[GenerateRequest] = TypeAdapter(GenerateRequest)
CANCEL: TypeAdapter[Cancel] = TypeAdapter(Cancel)


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    ready: asyncio.Event | None = None,
    policy: SelectionPolicy | None = None,
) -> None:
    """Serve until ``stop`` (or a signal); ``ready`` is set once the handlers are subscribed."""
    async with (
        Runtime.start(settings, "dispatcher", stop=stop, watch=("gateway", "dispatcher")) as rt,
        role(rt, settings, policy=policy) as dispatcher,
    ):
        await rt.serve(ready=ready, drain=dispatcher.drain)


@contextlib.asynccontextmanager
async def role(
    rt: Runtime,
    settings: Settings,
    *,
    policy: SelectionPolicy | None = None,
    local_parsers: dict[str, Callable[[TokenFrame], None]] | None = None,
) -> AsyncIterator[Dispatcher]:
    """The dispatcher role on ``rt``: made, wired to the bus, and stopped on the way out (every
    role of a process has this shape: ``encoder.app.role``, ``parser.app.role``)."""
    async with Dispatcher(settings, policy=policy) as dispatcher:
        await wire(rt, dispatcher, local_parsers=local_parsers)
        yield dispatcher


async def wire(
    rt: Runtime, dispatcher: Dispatcher, *, local_parsers: dict[str, Callable[[TokenFrame], None]] | None = None
) -> None:
    """``dispatcher`` takes generations from the dispatchers' queue group, hears cancels and
    gateway deaths, and reports its engines' health (waiting, bounded, for the first poll, so
    that the first heartbeat tells the truth). ``local_parsers``: see ``Dispatcher.bind``."""
    settings = dispatcher.settings
    dispatcher.bind(rt.bus, local_parsers=local_parsers)
    await dispatcher.join()
    rt.peers.on_death(dispatcher.on_death)
    subjects = settings.subjects
    await rt.bus.subscribe(subjects.cancel, CANCEL, dispatcher.on_cancel)
    await rt.bus.subscribe(
        subjects.generate, GENERATE, dispatcher.on_generate, queue=DISPATCHER_QUEUE, takes_work=True, inline=True
    )
    rt.load = lambda: dispatcher.load
    rt.ready = dispatcher.readiness
    rt.simulated = lambda: any(e.simulated for e in dispatcher.engines)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(dispatcher.health_checked.wait(), settings.health_timeout_s + 1)
    log.info(
        "dispatcher %s: engines %s",
        settings.instance_id,
        ", ".join(f"{e.kind}={e.url}" for e in dispatcher.engines) or "none",
    )
