"""``KvSubscriber`` against the simulator's ``KvPublisher`` over real ZMQ sockets on loopback:
batches in order, a lost batch fetched from the replay socket, the faults that drop the view
(a gap nothing can fill, undecodable batches in a row, an engine restart) and those that do not
(one undecodable batch, an unknown event type). Every wait is on what the subscriber reported."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from services.common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent, WireForm
from services.dispatcher.kv_subscriber import KvSubscriber
from services.simengine.kv_publisher import KvPublisher, start_kv_events
from services.simengine.settings import Settings
from services.simengine.state import PrefixCache

LOOPBACK = "tcp://127.0.0.1:*"
WAIT_S = 10.0


def stored(n: int) -> BlockStored:
    return BlockStored((n,), None, tuple(range(n, n + 4)), 4, medium="GPU")


@dataclass
class Seen:
    """What the subscriber handed on, and a way to wait for more."""

    batches: list[tuple[int, EventBatch]] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def batch(self, seq: int, batch: EventBatch) -> None:
        self.batches.append((seq, batch))
        self.changed.set()

    def reset(self, reason: str) -> None:
        self.resets.append(reason)
        self.changed.set()

    @property
    def seqs(self) -> list[int]:
        return [seq for seq, _ in self.batches]

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not done():
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def running(
    *, replay: bool = True, subscriber_replay: bool = True, buffer_steps: int = 100, form: WireForm = "map"
) -> AsyncIterator[tuple[KvPublisher, KvSubscriber, Seen]]:
    """A started publisher and a subscriber whose subscription the publisher has seen."""
    publisher = KvPublisher(LOOPBACK, LOOPBACK if replay else None, "kv@sim", form, buffer_steps=buffer_steps)
    publisher.start()
    seen = Seen()
    subscriber = KvSubscriber(
        publisher.endpoint,
        publisher.replay_endpoint if subscriber_replay else None,
        seen.batch,
        seen.reset,
        silence_s=30.0,
        engine="test",
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(publisher.serve())
        tg.create_task(subscriber.run(stop))
        try:
            async with asyncio.timeout(WAIT_S):
                await publisher.wait_for_subscriber()
            yield publisher, subscriber, seen
        finally:
            stop.set()
            publisher.close()


@pytest.mark.parametrize("form", ["map", "array"])
async def test_batches_arrive_in_order(form: WireForm) -> None:
    async with running(form=form) as (publisher, subscriber, seen):
        sent: list[tuple[KvEvent, ...]] = [
            (stored(1), stored(2)),
            (BlockRemoved((2,), "GPU"),),
            (AllBlocksCleared(),),
            (stored(3),),
        ]
        for events in sent:
            publisher.publish(events)
        await seen.until(lambda: len(seen.batches) == len(sent))
    assert seen.seqs == [0, 1, 2, 3]
    assert [batch.events for _, batch in seen.batches] == sent
    assert {batch.data_parallel_rank for _, batch in seen.batches} == {0}
    assert seen.resets == [] and subscriber.last_seq == 3
    assert subscriber.counts.keys() <= {"applied", "replayed"}  # live, or brought by the replay on joining
    age = subscriber.last_event_age
    assert age is not None and age < WAIT_S and not subscriber.silent


async def test_a_lost_batch_is_replayed_in_order() -> None:
    async with running() as (publisher, subscriber, seen):
        publisher.publish([stored(0)])
        publisher.publish([stored(1)], lost=True)
        publisher.publish([stored(2)], lost=True)
        publisher.publish([stored(3)])
        await seen.until(lambda: len(seen.batches) == 4)
    assert seen.seqs == [0, 1, 2, 3]
    assert [batch.events for _, batch in seen.batches] == [(stored(n),) for n in range(4)]
    assert seen.resets == []
    assert subscriber.counts["gap"] == 1 and subscriber.counts["replayed"] == 2


@contextlib.asynccontextmanager
async def joined_late() -> AsyncIterator[tuple[KvPublisher, KvSubscriber, Seen]]:
    """A publisher that published batches 0-2 before anyone listened, and a subscriber started
    after them (stopped, with the publisher, on the way out)."""
    publisher = KvPublisher(LOOPBACK, LOOPBACK)
    publisher.start()
    for n in range(3):
        publisher.publish([stored(n)])  # nobody listening yet
    seen = Seen()
    assert publisher.replay_endpoint is not None
    subscriber = KvSubscriber(publisher.endpoint, publisher.replay_endpoint, seen.batch, seen.reset, silence_s=30.0)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(publisher.serve())
        tg.create_task(subscriber.run(stop))
        try:
            yield publisher, subscriber, seen
        finally:
            stop.set()
            publisher.close()


async def test_a_subscriber_that_joins_late_catches_up() -> None:
    async with joined_late() as (publisher, _, seen):
        async with asyncio.timeout(WAIT_S):
            await publisher.wait_for_subscriber()
        publisher.publish([stored(3)])
        await seen.until(lambda: len(seen.batches) == 4)
    assert seen.seqs == [0, 1, 2, 3] and seen.resets == []


async def test_a_gap_without_a_replay_socket_resets() -> None:
    async with running(subscriber_replay=False) as (publisher, subscriber, seen):
        publisher.publish([stored(0)])
        publisher.publish([stored(1)], lost=True)
        publisher.publish([stored(2)])
        await seen.until(lambda: len(seen.batches) == 2)
    assert seen.resets == ["batches 1..1 missed and no replay socket"]
    assert seen.seqs == [0, 2]  # the view starts again from the batch at hand
    assert subscriber.counts["gap"] == 1 and subscriber.counts["reset"] == 1


async def test_a_gap_the_engine_no_longer_keeps_resets() -> None:
    async with running(buffer_steps=1) as (publisher, _subscriber, seen):
        publisher.publish([stored(0)])
        publisher.publish([stored(1)], lost=True)
        publisher.publish([stored(2)], lost=True)  # pushes 1 out of the replay buffer
        publisher.publish([stored(3)])
        await seen.until(lambda: len(seen.batches) == 2)
    assert seen.resets == ["batches 1..2 missed and not replayed"]
    assert seen.seqs == [0, 3]


async def test_garbage_is_counted_not_fatal() -> None:
    future_event = ["BlockTransferred", [7], "GPU", "DISK"]
    mixed = msgspec.msgpack.encode([1.0, [future_event, ["BlockRemoved", [7], "GPU"]], 0])
    async with running() as (publisher, subscriber, seen):
        publisher.publish([stored(0)])
        publisher.publish_payload(b"\xc1 not msgpack")
        publisher.publish_payload(mixed)
        await seen.until(lambda: len(seen.batches) == 2)
        assert seen.resets == []
        assert [seq for seq, _ in seen.batches] == [0, 2]
        assert seen.batches[1][1].events == (BlockRemoved((7,), "GPU"),)
        assert subscriber.counts["undecodable"] == 1 and subscriber.counts["unknown"] == 1
        for _ in range(3):  # three in a row: something is wrong with this engine's stream
            publisher.publish_payload(b"\x93")
        await seen.until(lambda: bool(seen.resets))
        publisher.publish([stored(6)])
        await seen.until(lambda: len(seen.batches) == 3)
    assert seen.resets == ["3 undecodable batches in a row"]
    assert seen.batches[2] == (6, seen.batches[2][1]) and seen.batches[2][1].events == (stored(6),)


async def test_a_restarted_engine_resets() -> None:
    first = KvPublisher(LOOPBACK)
    first.start()
    seen = Seen()
    subscriber = KvSubscriber(first.endpoint, None, seen.batch, seen.reset, silence_s=30.0)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(first.serve())
        tg.create_task(subscriber.run(stop))
        async with asyncio.timeout(WAIT_S):
            await first.wait_for_subscriber()
        for n in range(3):
            first.publish([stored(n)])
        await seen.until(lambda: len(seen.batches) == 3)
        first.close()
        again = KvPublisher(first.endpoint)  # the same port, its sequence from 0 again
        again.start()
        tg.create_task(again.serve())
        async with asyncio.timeout(WAIT_S):
            await again.wait_for_subscriber()  # the subscriber reconnected by itself
        again.publish([stored(9)])
        await seen.until(lambda: len(seen.batches) == 4)
        stop.set()
        again.close()
    assert seen.resets == ["sequence went back from 2 to 0: the engine restarted"]
    assert seen.seqs == [0, 1, 2, 0] and seen.batches[3][1].events == (stored(9),)
    assert subscriber.counts["restart"] == 1


async def test_a_replay_socket_that_never_answers_resets() -> None:
    """A replay endpoint nobody serves: the replay times out, the view is dropped."""
    silent = KvPublisher(LOOPBACK)
    silent.start()
    nobody = KvPublisher(LOOPBACK, LOOPBACK)  # bound, never served: requests go unanswered
    nobody.start()
    assert nobody.replay_endpoint is not None
    seen = Seen()
    subscriber = KvSubscriber(
        silent.endpoint, nobody.replay_endpoint, seen.batch, seen.reset, silence_s=30.0, replay_timeout_s=0.2
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(silent.serve())
        tg.create_task(subscriber.run(stop))
        async with asyncio.timeout(WAIT_S):
            await silent.wait_for_subscriber()
        silent.publish([stored(0)])
        silent.publish([stored(1)], lost=True)
        silent.publish([stored(2)])
        await seen.until(lambda: len(seen.batches) == 2)
        stop.set()
        silent.close()
        nobody.close()
    assert seen.resets == ["batches 1..1 missed and not replayed"]


async def test_the_simulators_cache_reaches_a_subscriber() -> None:
    """``start_kv_events`` wires the simulated engine's prefix cache to its publisher."""
    assert start_kv_events(Settings(), PrefixCache()) is None  # no endpoint: nothing published
    settings = Settings(kv_events_endpoint=LOOPBACK, kv_events_replay_endpoint=LOOPBACK, kv_events_form="array")
    cache = PrefixCache(settings.kv_cache_tokens, settings.kv_block_size)
    publisher = start_kv_events(settings, cache)
    assert publisher is not None and publisher.replay_endpoint is not None
    seen = Seen()
    subscriber = KvSubscriber(publisher.endpoint, publisher.replay_endpoint, seen.batch, seen.reset, silence_s=30.0)
    stop = asyncio.Event()
    prompt = list(range(40))
    async with asyncio.TaskGroup() as tg:
        tg.create_task(publisher.serve())
        tg.create_task(subscriber.run(stop))
        async with asyncio.timeout(WAIT_S):
            await publisher.wait_for_subscriber()
        cache.lookup_and_insert(prompt)
        cache.clear()
        await seen.until(lambda: len(seen.batches) == 2)
        stop.set()
        publisher.close()
    (stored_event,) = seen.batches[0][1].events
    assert isinstance(stored_event, BlockStored) and stored_event.token_ids == tuple(prompt[:32])
    assert seen.batches[1][1].events == (AllBlocksCleared(),)


async def test_a_subscriber_that_joins_an_idle_engine_catches_up_at_once() -> None:
    """Nothing more is published (an idle engine): the kept batches are asked for on joining,
    and the batches published as it joins, which that replay may bring too, are not taken for
    an engine restart."""
    async with joined_late() as (publisher, subscriber, seen):
        await seen.until(lambda: len(seen.batches) == 3)
        async with asyncio.timeout(WAIT_S):
            await publisher.wait_for_subscriber()
        publisher.publish([stored(3)])
        await seen.until(lambda: len(seen.batches) == 4)
    assert seen.seqs == [0, 1, 2, 3] and seen.resets == []
    assert subscriber.counts["replayed"] == 3 and subscriber.counts["restart"] == 0
