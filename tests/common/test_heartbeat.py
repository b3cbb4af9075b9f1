"""Death verdicts: quick for pipeline instances, patient for gateways, none after a stall of
this process's own loop; a stopping peer being handled when this process stops is let go."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from contracts.messages.control import Heartbeat
from services.common.bus import Bus
from services.common.heartbeat import Peers
from tests.waiting import until


def beat(service: str, instance: str) -> Heartbeat:
    return Heartbeat(service=service, instance=instance, interval_s=0.01)


async def test_gateways_get_longer_than_pipeline_instances() -> None:
    peers = Peers(dead_after=0.05, gateway_dead_after=0.5)
    dead: list[tuple[str, str]] = []

    async def died(service: str, instance: str) -> None:
        dead.append((service, instance))

    peers.on_death(died)
    await peers.observe(beat("parser", "p1"))
    await peers.observe(beat("gateway", "g1"))
    # sleeps, not waits: the silence is what is under test (its length against each limit)
    await asyncio.sleep(0.1)
    await peers.sweep()
    assert dead == [("parser", "p1")]  # the gateway is only slow so far
    await asyncio.sleep(0.5)
    await peers.sweep()
    assert dead == [("parser", "p1"), ("gateway", "g1")]


async def test_every_role_of_a_dead_process_dies_with_it() -> None:
    """A worker beats as encoder, dispatcher and parser under one id: when the beats of one
    role are found missing, all three are dead in that step (none is left to be given work),
    and a process that only stopped one role (its "stopping" beat) keeps the others."""
    peers = Peers(dead_after=0.05, gateway_dead_after=0.5)
    dead: list[tuple[str, str]] = []

    async def died(service: str, instance: str) -> None:
        dead.append((service, instance))

    peers.on_death(died)
    for role in ("encoder", "dispatcher", "parser"):
        await peers.observe(beat(role, "w1"))
    await peers.observe(beat("parser", "p2"))
    # sleeps, not waits: w1's other roles silent past the 0.05 s limit, its parser role not
    await asyncio.sleep(0.03)
    await peers.observe(beat("parser", "w1"))  # its parser role was heard later than the others
    await peers.observe(beat("parser", "p2"))
    await asyncio.sleep(0.03)
    await peers.sweep()
    assert sorted(dead) == [("dispatcher", "w1"), ("encoder", "w1"), ("parser", "w1")]
    assert [p.beat.instance for p in peers.alive("parser")] == ["p2"]


async def test_no_verdicts_after_this_process_stalled() -> None:
    peers = Peers(dead_after=0.05, gateway_dead_after=0.05)
    dead: list[str] = []

    async def died(service: str, instance: str) -> None:
        dead.append(instance)

    peers.on_death(died)
    await peers.observe(beat("parser", "p1"))
    runner = asyncio.get_running_loop().create_task(peers.run(0.01))
    try:
        await asyncio.sleep(0.03)  # the runner's first sweeps, before the stall
        time.sleep(0.3)  # noqa: ASYNC251 - the point: this loop blocks, p1's beats go unread
        await asyncio.sleep(0.02)  # the runner's sweeps just after the stall: no verdict from them
        assert dead == []  # the stall is no evidence against p1
        await until(lambda: dead, 2, "p1 found dead in the silence after the stall")
        assert dead == ["p1"]  # silence after the stall is
    finally:
        runner.cancel()


class BusWithBacklog:
    """A bus whose other subscriptions never catch up (a backlog that outlives the process)."""

    async def caught_up(self, timeout: float = 2.0) -> None:
        await asyncio.sleep(3600)  # never caught up


async def test_a_stopping_peer_still_being_handled_is_let_go_when_this_process_stops() -> None:
    peers = Peers()
    peers._bus = cast(Bus, BusWithBacklog())
    runner = asyncio.get_running_loop().create_task(peers.run(0.01))
    await peers.observe(beat("parser", "p1"))
    await peers.observe(Heartbeat(service="parser", instance="p1", interval_s=0.01, stopping=True))
    [handling] = list(peers._stopping)
    await asyncio.sleep(0.02)  # a sleep, not a wait: the handling must not end in this time
    assert not handling.done()  # waiting for the backlog
    runner.cancel()
    await asyncio.wait([runner, handling], timeout=1)
    assert handling.cancelled() and not peers._stopping
