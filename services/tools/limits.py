"""Per-server limits, so one slow or dead MCP server cannot hold the whole service.

A flood of calls against a dead server would otherwise fill every handler slot with calls
waiting to connect, delaying calls to healthy servers. Two things stop it:

- ``ServerGate``: at most ``limit`` calls and listings run against one server (an origin,
  ``scheme://host:port``) at a time; at most ``max_waiting`` more wait, each for ``wait_s`` at
  most; the rest fail at once (``ServerBusy``). Other servers never wait on this one.
- ``RecentlyUnreachable``: a server that could not be reached is remembered for a few seconds,
  and calls to it fail at once, without a new connection attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field


class ServerBusy(Exception):
    """Too many calls to one server are running or waiting already."""


@dataclass(eq=False)
class _Slots:
    semaphore: asyncio.Semaphore
    holders: int = 0  # running, or waiting for a slot
    waiting: int = 0


@dataclass
class ServerGate:
    limit: int
    max_waiting: int
    wait_s: float
    _servers: dict[str, _Slots] = field(default_factory=dict, init=False)

    def running(self, server: str) -> int:
        slots = self._servers.get(server)
        return 0 if slots is None else slots.holders - slots.waiting

    def waiting(self, server: str) -> int:
        slots = self._servers.get(server)
        return 0 if slots is None else slots.waiting

    @contextlib.asynccontextmanager
    async def slot(self, server: str) -> AsyncIterator[None]:
        """Hold one of ``server``'s slots for the block. Raises ``ServerBusy`` when the queue is
        full, or when no slot frees up within ``wait_s``."""
        slots = self._servers.get(server)
        if slots is None:
            slots = self._servers[server] = _Slots(asyncio.Semaphore(max(1, self.limit)))
        if slots.semaphore.locked() and slots.waiting >= self.max_waiting:
            raise ServerBusy(f"{slots.holders - slots.waiting} calls running, {slots.waiting} waiting")
        slots.holders += 1
        try:
            await self._acquire(slots)
            try:
                yield
            finally:
                slots.semaphore.release()
        finally:
            slots.holders -= 1
            if slots.holders == 0 and self._servers.get(server) is slots:
                del self._servers[server]

    async def _acquire(self, slots: _Slots) -> None:
        if not slots.semaphore.locked():
            await slots.semaphore.acquire()
            return
        slots.waiting += 1
        queued = asyncio.timeout(self.wait_s)
        try:
            async with queued:
                await slots.semaphore.acquire()
        except TimeoutError:
            if queued.expired():
                raise ServerBusy(f"no free slot within {self.wait_s:g}s") from None
            raise
        finally:
            slots.waiting -= 1


class RecentlyUnreachable:
    """Servers that could not be reached in the last ``ttl_s`` seconds (``ttl_s`` <= 0: none)."""

    def __init__(self, ttl_s: float, max_entries: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # in expiry order

    def mark(self, server: str) -> None:
        if self._ttl_s <= 0:
            return
        self._until.pop(server, None)
        self._until[server] = self._clock() + self._ttl_s
        self._prune()
        while len(self._until) > self._max_entries:
            self._until.popitem(last=False)

    def clear(self, server: str) -> None:
        self._until.pop(server, None)

    def __contains__(self, server: str) -> bool:
        self._prune()
        return server in self._until

    def _prune(self) -> None:
        now = self._clock()
        while self._until and next(iter(self._until.values())) <= now:
            self._until.popitem(last=False)
