"""The parser service: one ParseSession per generation, fed by the dispatchers' token frames,
sending typed events to the owning gateway. Run several: gateways choose a worker per
generation from the workers' heartbeats (least loaded), without a round trip."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import TypeAdapter

from contracts.messages.control import Cancel
from contracts.messages.generate import TokenFrame
from services.common.harmony import harmony_encoding
from services.common.runtime import Runtime
from services.parser.handlers import Sessions
from services.parser.session import token_bytes
from services.parser.settings import Settings

TOKENS: TypeAdapter[TokenFrame] = TypeAdapter(TokenFrame)
CANCEL: TypeAdapter[Cancel] = TypeAdapter(Cancel)


async def run(settings: Settings, stop: asyncio.Event | None = None, *, ready: asyncio.Event | None = None) -> None:
    harmony_encoding()
    token_bytes()  # the vocabulary's byte table, before the first session needs it
    async with Runtime.start(settings, "parser", stop=stop, watch=("gateway",)) as rt, role(rt, settings) as parser:
        await rt.serve(ready=ready, drain=parser.drain)


@dataclass
class Parsing:
    """The parser role: its sessions, and its drain (new generations are taken until none
    opened for a while, then the open ones finish while a gateway is there to read them)."""

    rt: Runtime
    settings: Settings
    sessions: Sessions

    async def drain(self) -> None:
        peers = self.rt.peers
        await self.sessions.drain(self.settings.drain_quiet_s, senders=lambda: bool(peers.alive("gateway")))


@contextlib.asynccontextmanager
async def role(rt: Runtime, settings: Settings) -> AsyncIterator[Parsing]:
    """The parser role on ``rt``: its sessions fed by this instance's tokens subject, told of
    cancels and gateway deaths, idle ones expired; closed on the way out (the shape of every
    role: ``encoder.app.role``, ``dispatcher.app.role``)."""
    sessions = Sessions(rt.bus, settings.instance_id, window=settings.coalesce_window_ms / 1000)
    rt.peers.on_death(sessions.on_death)
    subjects = settings.subjects
    await rt.bus.subscribe(subjects.cancel, CANCEL, sessions.on_cancel)
    await rt.bus.subscribe(subjects.parser_tokens(settings.instance_id), TOKENS, sessions.on_tokens, inline=True)
    rt.load = lambda: len(sessions)

    async def expire_forever() -> None:
        while True:
            await asyncio.sleep(settings.session_idle_s / 4)
            sessions.expire(settings.session_idle_s)

    try:
        async with asyncio.TaskGroup() as tg:
            expiring = tg.create_task(expire_forever())
            try:
                yield Parsing(rt, settings, sessions)
            finally:
                expiring.cancel()
    finally:
        await sessions.close()
