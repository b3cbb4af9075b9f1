"""A process with several roles (a worker): the roles share one NATS connection, and each
role's view of its peers pauses while that connection is down and resumes with it, so a NATS
outage is never taken for the deaths of every gateway."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from contracts.messages.control import Heartbeat
from services.common.infra import ManagedProcess, free_port, start_nats
from services.common.runtime import Runtime
from services.common.settings import BusSettings


@pytest.fixture
def own_nats() -> Iterator[list[ManagedProcess]]:
    procs: list[ManagedProcess] = []
    yield procs
    for proc in procs:
        proc.stop()


async def test_joined_roles_pause_and_resume_with_the_shared_connection(own_nats: list[ManagedProcess]) -> None:
    port = free_port()
    proc, url = await asyncio.to_thread(start_nats, port)
    own_nats.append(proc)
    settings = BusSettings(nats_url=url, namespace="roles", gateway_dead_after_s=0.3)
    async with (
        Runtime.start(settings, "dispatcher", watch=("gateway",)) as first,
        Runtime.start(settings, "parser", joins=first, watch=("gateway",)) as joined,
    ):
        assert joined.bus.nc is first.bus.nc and first.roles == [first, joined]
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        joined.reconnect_callbacks.append(on_reconnect)
        beat = Heartbeat(service="gateway", instance="g1", interval_s=0.05)
        await first.bus.publish(first.settings.subjects.heartbeat("gateway"), beat)
        for role in (first, joined):
            await role.peers.wait_for(("gateway",), 5)
            assert alive(role, "g1")
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGKILL)  # NATS is gone; g1's beats with it
        await asyncio.sleep(0.6)  # a sleep, not a wait: longer than a gateway may stay silent
        for role in (first, joined):
            await role.peers.sweep()
            assert alive(role, "g1"), f"{role.service}: an outage taken for a death"
        proc, _ = await asyncio.to_thread(start_nats, port)
        own_nats.append(proc)
        async with asyncio.timeout(10):
            await reconnected.wait()  # the joined role's callbacks run on the shared reconnect


def alive(role: Runtime, instance: str) -> bool:
    """Does ``role`` count the gateway ``instance`` among the living?"""
    return any(peer.beat.instance == instance for peer in role.peers.alive("gateway"))
