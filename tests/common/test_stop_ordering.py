"""A peer that stops says so last: what it sent before its "stopping" heartbeat is handled
before the news is acted on, although each subscription hands its messages to its callback in
a task of its own (a busy subscription may still hold a frame when the heartbeat arrives)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from contracts.messages.control import Heartbeat
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.heartbeat import Peers
from services.common.outbox import Outboxes
from services.common.wire import Msg, Wire
from services.common.wire_subscription import Callback
from tests.waiting import until


@pytest.fixture
async def wire(nats_url: str) -> AsyncIterator[Wire]:
    w = await Wire.connect(nats_url, name="stop-ordering")
    yield w
    await w.close()


class Frame(BaseModel):
    items: list[str]


class Order(list[str]):
    """What happened, in order; ``until(n)`` waits for ``n`` entries."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def add(self, what: str) -> None:
        self.append(what)
        self._changed.set()

    async def until(self, count: int, timeout: float = 5.0) -> list[str]:
        async with asyncio.timeout(timeout):
            while len(self) < count:
                self._changed.clear()
                await self._changed.wait()
        return list(self)


@pytest.fixture
def subject() -> str:
    return f"stoptest.{uuid.uuid4().hex}"


async def test_caught_up_waits_for_the_other_subscriptions_backlog(wire: Wire, subject: str) -> None:
    order = Order()

    async def slow(msg: Msg) -> None:
        await asyncio.sleep(0.2)  # a busy subscription: its message is still being handled
        order.add(msg.data.decode())

    async def news(msg: Msg) -> None:
        await wire.caught_up()
        order.add(msg.data.decode())

    await wire.subscribe(f"{subject}.frames", cb=slow)
    await wire.subscribe(f"{subject}.news", cb=news)
    for name in ("frame1", "frame2"):
        await wire.publish(f"{subject}.frames", name.encode())
    await wire.publish(f"{subject}.news", b"stopped")
    assert await order.until(3) == ["frame1", "frame2", "stopped"]


async def test_caught_up_does_not_wait_for_its_own_subscription(wire: Wire, subject: str) -> None:
    """Called from a handler whose own next messages wait behind it: no deadlock."""
    order = Order()

    async def news(msg: Msg) -> None:
        await wire.caught_up()
        order.add(msg.data.decode())

    await wire.subscribe(subject, cb=news)
    for name in ("one", "two"):
        await wire.publish(subject, name.encode())
    assert await order.until(2, timeout=2) == ["one", "two"]


@dataclass
class Line:
    """A receiver whose ``Peers`` listen for parsers, and a sender on a connection of its own."""

    subjects: Subjects
    receiving: Wire
    sender: Wire
    peers: Peers

    async def beat(self, instance: str, *, stopping: bool = False) -> None:
        beat = Heartbeat(service="parser", instance=instance, interval_s=0.25, stopping=stopping)
        await self.sender.publish(self.subjects.heartbeat("parser"), beat.model_dump_json().encode())

    async def frames_to(self, cb: Callback) -> str:
        """Frames on a subject of the receiver's handled by ``cb``; the subject."""
        subject = f"{self.subjects.namespace}.events"
        await self.receiving.subscribe(subject, cb=cb)
        await self.receiving.flush()  # the server has every SUB before the sender publishes
        return subject


@pytest.fixture
async def line(nats_url: str, subject: str) -> AsyncIterator[Line]:
    subjects = Subjects(subject.replace(".", "-"))
    receiving = await Wire.connect(nats_url, name="receiver")
    sender = await Wire.connect(nats_url, name="sender")
    peers = Peers()
    try:
        await peers.listen(Bus(receiving, subjects), ["parser"])
        yield Line(subjects, receiving, sender, peers)
    finally:
        await sender.close()
        await receiving.close()


async def test_a_stopping_peers_earlier_frames_are_handled_before_its_death(line: Line) -> None:
    order = Order()

    async def on_frame(msg: Msg) -> None:
        await asyncio.sleep(0.05)  # a gateway busy with many generations' frames
        order.add(msg.data.decode())

    async def on_death(service: str, instance: str) -> None:
        order.add(f"{service} {instance} stopped")

    line.peers.on_death(on_death)
    frames = await line.frames_to(on_frame)
    await line.beat("p1")
    await line.peers.wait_for(("parser",), timeout=5)
    assert line.peers.alive("parser")
    for n in range(3):  # its last frames, then its last beat
        await line.sender.publish(frames, f"frame{n}".encode())
    await line.beat("p1", stopping=True)
    assert await order.until(4) == ["frame0", "frame1", "frame2", "parser p1 stopped"]


async def test_outboxes_flush_sends_what_waits_and_stays_open(wire: Wire, subject: str) -> None:
    got: list[list[str]] = []

    async def record(msg: Msg) -> None:
        got.append(Frame.model_validate_json(msg.data).items)

    await wire.subscribe(subject, cb=record)
    bus = Bus(wire, Subjects("x"))
    boxes: Outboxes[str, Frame] = Outboxes(bus, lambda items: Frame(items=items), window=60.0)
    boxes.put(subject, "a", urgent=True)
    await until(lambda: got, 5, "the urgent item")  # gone; the window (60 s) now holds the rest
    boxes.put(subject, "b")
    boxes.put(subject, "c")
    await boxes.flush()
    await until(lambda: len(got) >= 2, 5, "the flushed frame")
    assert got == [["a"], ["b", "c"]]
    boxes.put(subject, "d", urgent=True)  # still open
    await until(lambda: len(got) >= 3, 5, "the urgent item after the flush")
    assert got == [["a"], ["b", "c"], ["d"]]
    await boxes.close()


async def test_other_beats_are_heard_while_a_stopping_peer_waits(line: Line) -> None:
    """Waiting for a busy subscription never holds up the heartbeats (peers would look dead)."""
    gate = asyncio.Event()
    died = Order()

    async def stuck(msg: Msg) -> None:
        await gate.wait()

    async def on_death(service: str, instance: str) -> None:
        died.add(instance)

    line.peers.on_death(on_death)
    try:
        frames = await line.frames_to(stuck)
        await line.beat("p1")
        await line.peers.wait_for(("parser",), timeout=5)
        await line.sender.publish(frames, b"held")
        await line.beat("p1", stopping=True)
        await line.beat("p2")
        # heard well before the 2 s bound on waiting for the held frame
        await until(lambda: [p.beat.instance for p in line.peers.alive("parser")] == ["p2"], 1.5, "p2's beat")
        assert list(died) == []  # p1's held frame is not handled yet
        gate.set()
        assert await died.until(1) == ["p1"]
    finally:
        gate.set()
