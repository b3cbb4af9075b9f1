"""The encoder service: renders conversations into Harmony prompt token ids."""

from __future__ import annotations

import asyncio

from services.common.harmony import harmony_encoding
from services.common.runtime import add_health, make_broker, serve
from services.encoder.handlers import register
from services.encoder.settings import Settings


async def run(
    settings: Settings, stop: asyncio.Event | None = None, *, ready: asyncio.Event | None = None
) -> None:
    harmony_encoding()  # load the vocabulary before answering anything
    broker = make_broker(settings, "encoder")
    register(broker, settings)
    add_health(broker, settings, "encoder")
    await serve(broker, stop=stop, ready=ready)
