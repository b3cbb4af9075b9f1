"""The parser service: one ParseSession per request, fed by the dispatcher's token stream,
sending typed events to the gateway. Run several; NATS's queue group spreads sessions."""

from __future__ import annotations

import asyncio
import contextlib

from contracts.messages.control import Cancel
from contracts.messages.parse import ParseOpen, ParseOpened
from contracts.subjects import PARSER_QUEUE
from services.common.harmony import harmony_encoding
from services.common.runtime import add_health, make_broker, serve
from services.parser.handlers import Sessions
from services.parser.settings import Settings


async def run(
    settings: Settings, stop: asyncio.Event | None = None, *, ready: asyncio.Event | None = None
) -> None:
    harmony_encoding()
    subjects = settings.subjects
    broker = make_broker(settings, "parser")
    token_subject = subjects.parser_tokens(settings.instance_id)
    sessions = Sessions(None, settings.instance_id, token_subject)
    tasks: list[asyncio.Task[None]] = []

    @broker.subscriber(subjects.parse_open, queue=PARSER_QUEUE)
    async def on_open(req: ParseOpen) -> ParseOpened:
        return sessions.open(req)

    @broker.subscriber(subjects.cancel)
    async def on_cancel(msg: Cancel) -> None:
        await sessions.cancel(msg)

    add_health(broker, settings, "parser")

    async def expire_forever() -> None:
        while True:
            await asyncio.sleep(settings.session_idle_s / 4)
            sessions.expire(settings.session_idle_s)

    async def on_start() -> None:
        sessions.nc = broker.connection
        await broker.connection.subscribe(token_subject, cb=sessions.on_tokens, pending_msgs_limit=-1)
        tasks.append(asyncio.ensure_future(expire_forever()))

    async def on_stop() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    await serve(broker, on_start=on_start, on_stop=on_stop, stop=stop, ready=ready)
