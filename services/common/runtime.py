"""Running a service: a faststream NatsBroker with health answering, until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

from faststream.nats import NatsBroker

from contracts.messages.control import Ping, Pong
from services.common.metrics import serve_metrics
from services.common.settings import BusSettings
from services.common.telemetry import setup_tracing

log = logging.getLogger("chorus")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # faststream logs every message at INFO; that is far too loud for a token stream.
    logging.getLogger("faststream").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per engine request / health poll


def make_broker(settings: BusSettings, name: str) -> NatsBroker:
    """The service's broker; with tracing configured, faststream's telemetry middleware opens a
    span per handled message, continuing the trace carried in the message headers."""
    provider = setup_tracing(name, settings.otlp_endpoint)
    serve_metrics(settings.metrics_port)
    middlewares = []
    if provider is not None:
        from faststream.nats.opentelemetry import NatsTelemetryMiddleware

        middlewares.append(NatsTelemetryMiddleware(tracer_provider=provider))
    return NatsBroker(
        settings.nats_url,
        name=f"chorus-{name}-{settings.instance_id}",
        logger=None,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        middlewares=middlewares,
    )


def add_health(
    broker: NatsBroker,
    settings: BusSettings,
    service: str,
    ready: Callable[[], tuple[bool, str]] = lambda: (True, ""),
) -> None:
    """Answer ``Ping`` on ``{ns}.health.{service}`` (queue group: one replica answers)."""

    @broker.subscriber(settings.subjects.health(service), queue=f"{service}-health")
    async def _health(_: Ping) -> Pong:
        ok, detail = ready()
        return Pong(service=service, instance=settings.instance_id, ready=ok, detail=detail)


async def serve(
    broker: NatsBroker,
    *,
    on_start: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Start the broker, run until ``stop`` is set or SIGINT/SIGTERM, then shut down.
    ``ready`` is set once every subscription is registered with the server."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    await broker.start()
    try:
        await broker.connection.flush()  # the handlers' subscriptions are on the server now
        if on_start:
            await on_start()
        await broker.connection.flush()
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        if on_stop:
            await on_stop()
        await broker.stop()
