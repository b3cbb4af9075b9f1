"""One service instance's life: its bus connection, heartbeat, peers, signals and drain.

    async with Runtime.start(settings, "encoder", stop=stop) as rt:
        await rt.bus.subscribe(...)
        rt.load = lambda: encoder.in_flight
        await rt.serve(ready=ready, drain=encoder.drain)

``serve`` runs until ``stop`` is set or SIGINT/SIGTERM arrives, then drains: the heartbeat says
"draining" (peers send nothing new), the queue groups that hand out work are left, and
``drain`` finishes what the instance holds (bounded by ``drain_timeout_s``). A last heartbeat
says "stopping", so peers do not wait for a death they would otherwise have to detect."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from prometheus_client import generate_latest

from contracts.messages.control import MetricsSnapshot
from services.common.bus import Bus
from services.common.heartbeat import Beater, Peers
from services.common.metrics import REGISTRY
from services.common.settings import BusSettings
from services.common.telemetry import setup_tracing

log = logging.getLogger("chorus")


class Role(Protocol):
    """What every role of a process is, once its ``app.role`` context made and wired it: a
    service whose work in hand can be finished (``drain``) before the process stops."""

    async def drain(self) -> None: ...


class Runtime:
    def __init__(
        self,
        settings: BusSettings,
        service: str,
        bus: Bus,
        stop: asyncio.Event,
        peers: Peers,
        roles: list[Runtime] | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.bus = bus
        self.stop = stop
        self.peers = peers
        self.load: Callable[[], int] = lambda: 0
        self.ready: Callable[[], tuple[bool, str]] = lambda: (True, "")
        self.simulated: Callable[[], bool] = lambda: False
        self.beater = Beater(
            bus,
            service,
            settings.instance_id,
            interval=settings.heartbeat_interval_s,
            load=lambda: self.load(),
            ready=lambda: self.ready(),
            simulated=lambda: self.simulated(),
            liveness_file=settings.liveness_file,
        )
        self.draining = False
        self.metrics_service = service  # the ``service`` label of this process's metrics
        self.roles: list[Runtime] = roles if roles is not None else []  # the roles sharing its connection
        # called after the NATS connection came back (messages may have been lost meanwhile)
        self.reconnect_callbacks: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls,
        settings: BusSettings,
        service: str,
        *,
        stop: asyncio.Event | None = None,
        watch: tuple[str, ...] = (),
        joins: Runtime | None = None,
    ) -> AsyncIterator[Runtime]:
        """Connect and listen to the heartbeats of the services in ``watch``. ``joins``: another role of this process (a
        worker's), whose connection this role shares: its peers pause and resume with that
        connection, and the process answers the stack's metrics request once, through it."""
        setup_tracing(service, settings.otlp_endpoint, instance_id=settings.instance_id)
        peers = Peers(dead_after=settings.dead_after_s, gateway_dead_after=settings.gateway_dead_after_s)
        roles: list[Runtime] = joins.roles if joins is not None else []  # every role on this connection

        async def disconnected() -> None:
            for role in roles:
                role.peers.pause()

        async def reconnected() -> None:
            for role in roles:
                role.peers.resume()
                for callback in role.reconnect_callbacks:
                    await callback()

        if joins is not None:  # one connection for the process's roles
            bus = Bus(joins.bus.nc, settings.subjects, claim_replicas=settings.nats_jetstream_replicas)
        else:
            bus = await Bus.connect(
                settings.nats_url,
                f"chorus-{service}-{settings.instance_id}",
                settings.subjects,
                options=settings.nats_options(),
                claim_replicas=settings.nats_jetstream_replicas,
                on_disconnect=disconnected,
                on_reconnect=reconnected,
            )
        rt = cls(settings, service, bus, stop or asyncio.Event(), peers, roles)
        roles.append(rt)
        try:
            if watch:
                await peers.listen(bus, list(watch))
            if joins is None:
                await bus.nc.subscribe(settings.subjects.metrics, cb=rt.answer_metrics)
            yield rt
        finally:
            if joins is None:  # the shared connection is closed by the role that made it
                await bus.close()

    async def answer_metrics(self, msg: Any) -> None:
        """This instance's metrics for the gateway's /metrics (every instance answers)."""
        if not msg.reply:
            return
        snapshot = MetricsSnapshot(
            service=self.metrics_service,
            instance=self.settings.instance_id,
            exposition=generate_latest(REGISTRY).decode(),
        )
        with contextlib.suppress(Exception):
            await self.bus.publish(msg.reply, snapshot)

    @contextlib.asynccontextmanager
    async def beating(self) -> AsyncIterator[None]:
        """Heartbeats out and peers' deaths noticed while inside; a last "stopping" beat at
        the end (for a process whose own server, e.g. uvicorn, owns the signals)."""
        beating = asyncio.get_running_loop().create_task(self.beater.run())
        sweeping = asyncio.get_running_loop().create_task(self.peers.run(self.settings.heartbeat_interval_s))
        try:
            yield
        finally:
            for task in (beating, sweeping):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.beater.send(stopping=True)
            self.beater.clear_liveness()

    async def serve(
        self, *, ready: asyncio.Event | None = None, drain: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop.set)
        await self.bus.nc.flush(timeout=5)  # every subscription is on the server now
        async with self.beating():
            log.info("%s %s: serving", self.service, self.settings.instance_id)
            if ready is not None:
                ready.set()
            await self.stop.wait()
            await self._drain(drain)

    async def _drain(self, drain: Callable[[], Awaitable[object]] | None) -> None:
        self.draining = self.beater.draining = True
        await self.beater.send()
        await self.bus.stop_taking_work()
        if drain is None:
            return
        log.info(
            "%s %s: draining (at most %gs)", self.service, self.settings.instance_id, self.settings.drain_timeout_s
        )
        try:
            async with asyncio.timeout(self.settings.drain_timeout_s):
                await drain()
        except TimeoutError:
            log.warning("%s %s: drain timed out; stopping with work in hand", self.service, self.settings.instance_id)
