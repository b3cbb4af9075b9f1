"""The outbox: one frame per window for what comes fast, at once for what comes after a pause or
is urgent, and a window that can change between frames (the dispatcher stretches it under load)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from pydantic import BaseModel

from services.common.bus import Bus
from services.common.outbox import Outbox
from tests.waiting import until


class Frame(BaseModel):
    items: list[int]


class FakeBus:
    """What an outbox needs of a bus: ``publish`` and ``publish_nowait`` (which says whether it
    could send in the caller's step: ``sends_now``); frames are recorded with their loop time."""

    def __init__(self, *, sends_now: bool = True) -> None:
        self.sent: list[tuple[float, list[int]]] = []
        self.sends_now = sends_now

    async def publish(self, subject: str, msg: BaseModel | bytes, headers: dict[str, str] | None = None) -> None:
        assert isinstance(msg, Frame)
        self.sent.append((asyncio.get_running_loop().time(), msg.items))

    def publish_nowait(self, subject: str, msg: BaseModel) -> bool:
        assert isinstance(msg, Frame)
        if self.sends_now:
            self.sent.append((asyncio.get_running_loop().time(), msg.items))
        return self.sends_now


def outbox(bus: FakeBus, window: Any) -> Outbox[int, Frame]:
    return Outbox(cast(Bus, bus), "s", lambda items: Frame(items=items), window=window)


async def settle() -> None:
    """A few turns of the loop, no time: what the outbox's task sends at once has gone by the
    end, what waits for its window has not (for asserting that it waits)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def sent(bus: FakeBus, count: int) -> list[list[int]]:
    """The items of each frame, once ``count`` frames have gone (a window's frame: its time)."""
    await until(lambda: len(bus.sent) >= count, 2, f"{count} frames sent")
    return [items for _, items in bus.sent]


async def test_after_a_pause_an_item_goes_at_once_then_fast_ones_share_a_frame() -> None:
    bus = FakeBus()
    box = outbox(bus, 0.05)
    box.put(1)
    await settle()
    assert [items for _, items in bus.sent] == [[1]]
    for i in range(2, 6):
        box.put(i)
    await settle()
    assert len(bus.sent) == 1  # inside the window: waiting for company
    assert await sent(bus, 2) == [[1], [2, 3, 4, 5]]
    assert bus.sent[1][0] - bus.sent[0][0] >= 0.045
    await box.close()


async def test_urgent_items_do_not_wait_for_the_window() -> None:
    for sends_now in (True, False):  # in the caller's step, or by the outbox's task
        bus = FakeBus(sends_now=sends_now)
        box = outbox(bus, 0.5)
        box.put(1)
        await settle()
        box.put(2)
        box.put(3, urgent=True)  # takes what waits along
        await settle()
        assert [items for _, items in bus.sent] == [[1], [2, 3]]
        box.put(4)
        await settle()
        assert len(bus.sent) == 2  # inside the window again
        await box.close()
        assert [items for _, items in bus.sent] == [[1], [2, 3], [4]]


async def test_an_urgent_item_leaves_in_the_callers_step_when_the_bus_can_send_it() -> None:
    bus = FakeBus()
    box = outbox(bus, 0.5)
    box.put(1)
    box.put(2, urgent=True)
    assert [items for _, items in bus.sent] == [[1, 2]]  # no loop iteration in between
    await box.close()
    assert [items for _, items in bus.sent] == [[1, 2]]


async def test_the_window_is_asked_at_each_frame() -> None:
    bus = FakeBus()
    window = [0.0]
    box = outbox(bus, lambda: window[0])
    for i in range(3):
        box.put(i)
        await settle()
    assert [items for _, items in bus.sent] == [[0], [1], [2]]  # no window: each at once
    window[0] = 0.05  # under load
    box.put(3)
    box.put(4)
    await settle()
    assert len(bus.sent) == 3
    assert (await sent(bus, 4))[-1] == [3, 4]
    await box.close()


async def test_close_sends_what_waits() -> None:
    bus = FakeBus()
    box = outbox(bus, 10.0)
    box.put(1)
    await settle()
    box.put(2)
    await box.close()
    assert [items for _, items in bus.sent] == [[1], [2]]


class SlowBigFrames(FakeBus):
    """A frame over ``limit`` items cannot go in the caller's step and takes ``gate`` to send
    (a payload over NATS's limit goes through the object store first)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.gate = asyncio.Event()

    async def publish(self, subject: str, msg: BaseModel | bytes, headers: dict[str, str] | None = None) -> None:
        await self.gate.wait()
        await super().publish(subject, msg, headers)

    def publish_nowait(self, subject: str, msg: BaseModel) -> bool:
        assert isinstance(msg, Frame)
        return len(msg.items) <= self.limit and super().publish_nowait(subject, msg)


async def test_an_urgent_item_never_overtakes_a_frame_still_on_its_way() -> None:
    """The first tokens of a generation carry its parse spec (tool schemas: possibly megabytes,
    sent through the object store); the tokens after them must not arrive first."""
    bus = SlowBigFrames(limit=2)
    box = outbox(bus, 0.0)
    box.put(1)
    box.put(2)
    box.put(3, urgent=True)  # three items: too big to go now; the task sends them, slowly
    await settle()
    box.put(4, urgent=True)  # small, but the frame before it is still on its way
    await settle()
    assert bus.sent == []
    bus.gate.set()
    await settle()
    assert [items for _, items in bus.sent] == [[1, 2, 3], [4]]
    await box.close()


async def test_a_frame_the_bus_cannot_send_at_once_goes_from_the_task() -> None:
    """A frame over the server's payload limit (it travels as a JetStream claim) cannot be
    written in the caller's step: the task sends it, once, in order with what follows."""
    bus = FakeBus(sends_now=False)
    box: Outbox[int, Frame] = Outbox(cast(Bus, bus), "s", lambda items: Frame(items=items), window=0.0)
    box.put(1, urgent=True)
    await settle()
    assert [items for _, items in bus.sent] == [[1]]
    bus.sends_now = True
    box.put(2, urgent=True)
    assert [items for _, items in bus.sent] == [[1], [2]]
    await box.close()
