"""The dispatcher service: the only place that wires the broker, the engine HTTP client and
the dispatcher together."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from services.common.runtime import add_health, make_broker, serve
from services.dispatcher.handlers import register
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings
from services.dispatcher.workers import SelectionPolicy

log = logging.getLogger("chorus.dispatcher")


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    ready: asyncio.Event | None = None,
    policy: SelectionPolicy | None = None,
) -> None:
    """Serve until ``stop`` (or a signal); ``ready`` is set once the handlers are subscribed."""
    async with Dispatcher(settings, policy=policy) as dispatcher:
        broker = make_broker(settings, "dispatcher")
        register(broker, settings, dispatcher)
        add_health(broker, settings, "dispatcher", dispatcher.readiness)

        async def publish(subject: str, data: bytes, headers: dict[str, str]) -> None:
            await broker.connection.publish(subject, data, headers=headers)

        dispatcher.bind(publish)  # the connection is there before the first request is
        # answer the first health ping with a real answer: wait (bounded) for the first poll
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(dispatcher.health_checked.wait(), settings.health_timeout_s + 1)

        async def started() -> None:
            log.info("dispatcher %s: engines %s", settings.instance_id,
                     ", ".join(f"{w.kind}={w.url}" for w in dispatcher.workers) or "none")
            if ready is not None:
                ready.set()

        await serve(broker, on_start=started, on_stop=dispatcher.shutdown, stop=stop)
