"""Per-server limits: the concurrency gate and the memory of unreachable servers."""

from __future__ import annotations

import asyncio

import pytest

from services.tools.limits import RecentlyUnreachable, ServerBusy, ServerGate

A, B = "http://a:80", "http://b:80"


class Holder:
    """A task holding a slot of ``gate`` for ``server`` until released."""

    def __init__(self, gate: ServerGate, server: str, tg: asyncio.TaskGroup) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.task = tg.create_task(self._hold(gate, server))

    async def _hold(self, gate: ServerGate, server: str) -> None:
        async with gate.slot(server):
            self.entered.set()
            await self.release.wait()


async def test_one_server_full_does_not_delay_another() -> None:
    gate = ServerGate(limit=2, max_waiting=2, wait_s=60)
    async with asyncio.TaskGroup() as tg:
        running = [Holder(gate, A, tg) for _ in range(2)]
        for h in running:
            await h.entered.wait()
        queued = Holder(gate, A, tg)
        other = Holder(gate, B, tg)
        await other.entered.wait()  # B got in at once, while A is full
        assert gate.running(A) == 2 and gate.waiting(A) == 1 and gate.running(B) == 1
        assert not queued.entered.is_set()
        running[0].release.set()
        await queued.entered.wait()  # a freed slot goes to the waiting call
        for h in (running[1], queued, other):
            h.release.set()
    assert gate.running(A) == gate.running(B) == 0


async def test_a_full_queue_turns_calls_away_at_once() -> None:
    gate = ServerGate(limit=1, max_waiting=1, wait_s=60)
    async with asyncio.TaskGroup() as tg:
        running = Holder(gate, A, tg)
        await running.entered.wait()
        queued = Holder(gate, A, tg)
        marker = Holder(gate, B, tg)  # tasks run in order: once this one is in, A's is waiting
        await marker.entered.wait()
        assert gate.waiting(A) == 1
        with pytest.raises(ServerBusy, match="1 calls running, 1 waiting"):
            async with gate.slot(A):
                pass
        running.release.set()
        await queued.entered.wait()
        queued.release.set()
        marker.release.set()


async def test_waiting_is_bounded() -> None:
    gate = ServerGate(limit=1, max_waiting=4, wait_s=0.05)
    async with asyncio.TaskGroup() as tg:
        running = Holder(gate, A, tg)
        await running.entered.wait()
        with pytest.raises(ServerBusy, match="no free slot within 0.05s"):
            async with gate.slot(A):
                pass
        running.release.set()
    async with gate.slot(A):  # and the slot is free again afterwards
        assert gate.running(A) == 1


async def test_an_outer_deadline_is_not_reported_as_busy() -> None:
    gate = ServerGate(limit=1, max_waiting=4, wait_s=60)
    async with asyncio.TaskGroup() as tg:
        running = Holder(gate, A, tg)
        await running.entered.wait()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05), gate.slot(A):
                pass
        running.release.set()
    assert gate.running(A) == 0


def test_unreachable_servers_are_remembered_briefly() -> None:
    now = [0.0]
    memory = RecentlyUnreachable(ttl_s=5, max_entries=2, clock=lambda: now[0])
    memory.mark(A)
    assert A in memory and B not in memory
    now[0] = 4.9
    assert A in memory
    now[0] = 5.0
    assert A not in memory
    memory.mark(A)
    memory.clear(A)
    assert A not in memory
    for server in (A, B, "http://c:80"):
        memory.mark(server)
    assert A not in memory and B in memory  # at most max_entries, oldest out


def test_memory_can_be_turned_off() -> None:
    memory = RecentlyUnreachable(ttl_s=0)
    memory.mark(A)
    assert A not in memory
