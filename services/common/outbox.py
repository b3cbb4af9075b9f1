"""Messages for one destination gathered while the event loop is busy and sent as one frame,
or at once when it is idle (``Outbox``), one per destination subject (``Outboxes``): what keeps
the cost per token flat when many generations stream through one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:
    from services.common.bus import Bus

log = logging.getLogger("chorus.bus")

T = TypeVar("T")
F = TypeVar("F", bound=BaseModel)

Window = float | Callable[[], float]  # seconds, or asked at each frame


def _fixed(seconds: float) -> Callable[[], float]:
    return lambda: seconds


class Outbox(Generic[T, F]):
    """Items for one subject, sent together as one frame.

    ``put`` never waits. An urgent item (the first tokens of a generation: what its time to
    first token depends on) goes out at once, in the caller's step, with whatever else waits.
    Other items go out at once too when the last frame left more than ``window`` seconds ago
    (an engine producing a token every few milliseconds is never delayed); when they come
    faster, at most one frame per ``window`` carries everything put in the meantime, from
    every request: the cost per message stops growing with the number of tokens.

    ``window`` may be a function, asked at each frame: a sender under load stretches it (many
    generations in flight: each one's tokens then travel several to a message, and every hop
    after this one writes, parses and sends once per several tokens instead of per token).

    ``local``: the receiver lives in this process (a worker's parser); each frame is handed to
    it in the step that would have published it, with the same coalescing."""

    def __init__(
        self,
        bus: Bus,
        subject: str,
        frame: Callable[[list[T]], F],
        *,
        window: Window = 0.0,
        local: Callable[[F], None] | None = None,
    ) -> None:
        self.bus = bus
        self.subject = subject
        self._frame = frame
        self._local = local  # the receiver is in this process: its handler, called with each frame
        self._window = window if callable(window) else _fixed(window)
        self._timer: asyncio.TimerHandle | None = None
        self._items: list[T] = []
        self._ready = asyncio.Event()
        self._scheduled = False
        self._last = 0.0  # loop time of the last frame
        self._task: asyncio.Task[None] | None = None
        self._sending = False  # a frame is on its way (a large one waits for the object store)
        self.frames = 0

    def put(self, item: T, *, urgent: bool = False) -> None:
        self._items.append(item)
        if urgent and self._send_now():
            return
        if self._scheduled and not (urgent and self._timer is not None):
            return
        self._scheduled = True
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._run(), name=f"outbox {self.subject}")
        wait = 0.0 if urgent else self._last + self._window() - loop.time()
        if wait > 0:
            self._timer = loop.call_later(wait, self._ready.set)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._ready.set()

    def _send_now(self) -> bool:
        """Everything waiting, sent in this step if the bus can (else the task sends it): never
        while an earlier frame is still on its way, which it would overtake."""
        if self._local is None and self._sending:
            return False
        items = self._items
        try:
            if self._local is not None:
                self._local(self._frame(items))
            elif not self.bus.publish_nowait(self.subject, self._frame(items)):
                return False
        except Exception:  # the bus is down: the receiver's recovery takes over
            log.warning("sending %d item(s) to %s failed", len(items), self.subject, exc_info=True)
        self._items = []
        self.frames += 1
        self._last = asyncio.get_running_loop().time()
        return True

    @property
    def pending(self) -> int:
        return len(self._items)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._ready.wait()
            self._ready.clear()
            self._scheduled = False
            self._timer = None
            self._last = loop.time()
            await self.flush()

    async def flush(self) -> None:
        if not self._items:
            return
        items, self._items = self._items, []
        self.frames += 1
        self._sending = True
        try:
            if self._local is not None:
                self._local(self._frame(items))
            else:
                await self.bus.publish(self.subject, self._frame(items))
        except Exception:  # the bus is down: the receiver's recovery takes over
            log.warning("sending %d item(s) to %s failed", len(items), self.subject, exc_info=True)
        finally:
            self._sending = False

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class Outboxes(Generic[T, F]):
    """One ``Outbox`` per destination subject, created on first use."""

    def __init__(
        self,
        bus: Bus,
        frame: Callable[[list[T]], F],
        *,
        window: Window = 0.0,
        local: dict[str, Callable[[F], None]] | None = None,
    ) -> None:
        self.bus = bus
        self._frame = frame
        self._window = window
        self._boxes: dict[str, Outbox[T, F]] = {}
        # subjects whose receiver is in this process: frames are handed to it, not published
        self.local: dict[str, Callable[[F], None]] = local or {}

    def put(self, subject: str, item: T, *, urgent: bool = False) -> None:
        box = self._boxes.get(subject)
        if box is None:
            box = self._boxes[subject] = Outbox(
                self.bus, subject, self._frame, window=self._window, local=self.local.get(subject)
            )
        box.put(item, urgent=urgent)

    async def forget(self, subject: str) -> None:
        """A destination that died: drop its box."""
        box = self._boxes.pop(subject, None)
        if box is not None:
            box._items.clear()
            await box.close()

    async def flush(self) -> None:
        """Send everything waiting now (a draining service, before it says it stops)."""
        for box in list(self._boxes.values()):
            await box.flush()

    async def close(self) -> None:
        for box in list(self._boxes.values()):
            await box.close()
