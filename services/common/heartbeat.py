"""Liveness over the bus: every instance beats, peers keep a registry.

``Beater`` publishes this instance's ``Heartbeat`` every ``interval`` seconds (and touches a
liveness file, which a container healthcheck reads at no cost). ``Peers`` records the beats it
hears and declares an instance dead when ``dead_after`` seconds pass without one, calling the
``on_death`` callbacks: deaths are noticed in about a second, not by a request timeout.

While this process's own NATS connection is down every peer would look dead; ``Peers`` pauses
its verdicts then, and gives everyone a fresh grace period once the connection is back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter

from contracts.messages.control import Heartbeat
from services.common.bus import Bus

log = logging.getLogger("chorus.heartbeat")

HEARTBEAT: TypeAdapter[Heartbeat] = TypeAdapter(Heartbeat)


@dataclass
class Peer:
    beat: Heartbeat
    seen: float  # monotonic time of the last beat
    load: int = 0  # the last reported load plus work given to it since (by this process)
    confirmed: bool = True  # heard since our own connection last came back

    @property
    def usable(self) -> bool:
        return self.confirmed and self.beat.ready and not self.beat.draining and not self.beat.stopping


DeathCallback = Callable[[str, str], Awaitable[None]]  # (service, instance)


class Peers:
    """``dead_after`` is how long a pipeline instance (encoder, dispatcher, parser) may stay
    silent before its work is resumed elsewhere: quickly, as resuming loses nothing. A gateway
    gets ``gateway_dead_after``: what follows its death (its generations aborted) cannot be
    undone, so a gateway that is merely slow (a loaded machine) must not be counted dead."""

    def __init__(self, *, dead_after: float = 1.0, gateway_dead_after: float = 10.0) -> None:
        self.dead_after = dead_after
        self.gateway_dead_after = gateway_dead_after
        self._peers: dict[str, dict[str, Peer]] = {}
        self._on_death: list[DeathCallback] = []
        self._paused = False
        self._bus: Bus | None = None  # the bus the beats come in on
        self._stopping: set[asyncio.Task[None]] = set()  # peers that said they stop, being handled
        self._heard = asyncio.Event()  # set on every beat (for ``wait_for``)

    def on_death(self, callback: DeathCallback) -> None:
        self._on_death.append(callback)

    async def observe(self, beat: Heartbeat) -> None:
        self._heard.set()
        peers = self._peers.setdefault(beat.service, {})
        if beat.stopping:
            if peers.pop(beat.instance, None) is not None:
                log.info("%s %s stopped", beat.service, beat.instance)
                # in a task of its own: the other beats keep coming in meanwhile
                task = asyncio.get_running_loop().create_task(self._stopped(beat.service, beat.instance))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
            return
        peer = peers.get(beat.instance)
        if peer is None:
            log.info("%s %s is up", beat.service, beat.instance)
            peers[beat.instance] = Peer(beat, time.monotonic(), beat.load)
        else:
            peer.beat, peer.seen, peer.load, peer.confirmed = beat, time.monotonic(), beat.load, True

    async def _stopped(self, service: str, instance: str) -> None:
        """A peer's last beat: what it sent before that is handled first (a busy subscription
        may still hold its last frames), then its work is given up as after a death."""
        if self._bus is not None:
            await self._bus.caught_up()
        await self._died(service, instance)

    async def wait_for(self, services: tuple[str, ...], timeout: float) -> None:
        """Until every one of ``services`` has been heard from (at most ``timeout`` seconds):
        a process starting next to a running stack knows its peers before taking requests."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not all(self._peers.get(s) for s in services):
                    self._heard.clear()
                    await self._heard.wait()

    async def wait_usable(self, service: str, timeout: float) -> bool:
        """Until an instance of ``service`` that takes work is heard from (at most ``timeout``
        seconds): a supervisor restarting the only instance takes about a second."""
        if any(p.usable for p in self.alive(service)):
            return True  # the usual case, without a timer
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not any(p.usable for p in self.alive(service)):
                    self._heard.clear()
                    await self._heard.wait()
        return any(p.usable for p in self.alive(service))

    def alive(self, service: str) -> list[Peer]:
        return list(self._peers.get(service, {}).values())

    def pick(self, service: str) -> Peer | None:
        """The usable instance with the least load (work given since its last beat counts)."""
        usable = [p for p in self.alive(service) if p.usable]
        if not usable:
            return None
        best = min(usable, key=lambda p: p.load)
        best.load += 1
        return best

    def pause(self) -> None:
        """Our own connection is down: no verdicts until ``resume``."""
        self._paused = True

    def resume(self) -> None:
        """Our connection is back: everyone gets a fresh grace period, and nobody is given
        work until heard again (a peer's beat after its own reconnect means its
        subscriptions are back too)."""
        for peer in self._grace():
            peer.confirmed = False
        self._paused = False

    def _grace(self) -> list[Peer]:
        """Everyone counts as heard from now (a fresh grace period); the peers, for the caller."""
        now = time.monotonic()
        everyone = [peer for peers in self._peers.values() for peer in peers.values()]
        for peer in everyone:
            peer.seen = now
        return everyone

    async def sweep(self) -> None:
        if self._paused:
            return
        now = time.monotonic()
        for service, peers in list(self._peers.items()):
            for instance, peer in list(peers.items()):
                patience = self.gateway_dead_after if service == "gateway" else self.dead_after
                limit = max(patience, 3 * peer.beat.interval_s)
                if now - peer.seen > limit and instance in peers:
                    log.warning(
                        "%s %s missed its heartbeats for %.1fs: counted dead", service, instance, now - peer.seen
                    )
                    await self._instance_died(instance)

    async def _instance_died(self, instance: str) -> None:
        """Every role of a dead process dies with it (a worker beats as encoder, dispatcher and
        parser under one instance id): all of them are dead in the same step, so nothing is
        given to a role of a process already known dead."""
        roles = [service for service, peers in self._peers.items() if peers.pop(instance, None) is not None]
        for service in roles:
            await self._died(service, instance)

    async def _died(self, service: str, instance: str) -> None:
        for callback in self._on_death:
            try:
                await callback(service, instance)
            except Exception:  # one callback failing must not stop the others
                log.exception("death callback for %s %s failed", service, instance)

    async def listen(self, bus: Bus, services: list[str]) -> None:
        self._bus = bus
        for service in services:
            await bus.subscribe(bus.subjects.heartbeat(service), HEARTBEAT, self.observe)

    async def run(self, interval: float) -> None:
        """Sweep for deaths every ``interval`` seconds, forever. When this process itself
        stalled (its loop blocked, the machine overloaded), the beats it did not read yet are
        no evidence against anyone: everyone gets a fresh grace period instead of a verdict."""
        last = time.monotonic()
        try:
            while True:
                await asyncio.sleep(interval)
                now = time.monotonic()
                if now - last > max(2 * interval, self.dead_after / 2):
                    log.info("this process stalled for %.1fs: no death verdicts this time", now - last)
                    self._grace()
                else:
                    await self.sweep()
                last = now
        finally:  # this process stops: so does the handling of peers that said they stop
            for task in list(self._stopping):
                task.cancel()


class Beater:
    """This instance's heartbeat."""

    def __init__(
        self,
        bus: Bus,
        service: str,
        instance: str,
        *,
        interval: float,
        load: Callable[[], int] = lambda: 0,
        ready: Callable[[], tuple[bool, str]] = lambda: (True, ""),
        simulated: Callable[[], bool] = lambda: False,
        liveness_file: str | None = None,
    ) -> None:
        self.bus, self.service, self.instance = bus, service, instance
        self.interval = interval
        self.load, self.ready, self.simulated = load, ready, simulated
        self.draining = False
        self.liveness = Path(liveness_file) if liveness_file else None

    def beat(self, *, stopping: bool = False) -> Heartbeat:
        ok, detail = self.ready()
        return Heartbeat(
            service=self.service,
            instance=self.instance,
            interval_s=self.interval,
            ready=ok,
            detail=detail,
            load=self.load(),
            draining=self.draining,
            stopping=stopping,
            simulated=self.simulated(),
        )

    async def send(self, *, stopping: bool = False) -> None:
        beat = self.beat(stopping=stopping)
        with contextlib.suppress(Exception):
            await self.bus.publish(self.bus.subjects.heartbeat(self.service), beat)
        # alive = connected and not stopping, ready or not (a dispatcher whose engines are
        # down is alive: restarting it would not bring them back)
        if self.liveness is not None and self.bus.nc.is_connected and not stopping:
            with contextlib.suppress(OSError):
                self.liveness.touch()

    async def run(self) -> None:
        while True:
            await self.send()
            await asyncio.sleep(self.interval)

    def clear_liveness(self) -> None:
        if self.liveness is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.liveness)
