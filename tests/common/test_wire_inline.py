"""Inline subscriptions: a message reaching an idle subscription starts its callback in the
socket's callback (no task is scheduled first), and everything else about the callback contract
holds: messages in order one at a time, a callback that waits goes on in a task with the later
messages queued behind it, failures and cancellation do not stop the subscription, context
variables stay the callback's own, and ``handled_upto`` counts inline callbacks too."""

from __future__ import annotations

import asyncio
import contextvars
import uuid

import pytest

from services.common.wire import Msg, Subscription, Wire
from tests.waiting import until

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


class Owner:
    """The connection side a subscription needs (nothing is sent in these tests)."""

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        raise AssertionError("not used")

    def _unsubscribe(self, sub: Subscription, *, forget: bool = True) -> None:
        pass

    async def _drain(self, subs: list[Subscription], timeout: float) -> None:
        pass

    def _idle(self) -> bool:
        return True


def msg(data: bytes) -> Msg:
    return Msg("s", "", data, None)


class Recorder:
    """A callback that records what it saw; ``waits[data]`` makes it wait on that event first."""

    def __init__(self) -> None:
        self.started: list[bytes] = []
        self.done: list[bytes] = []
        self.in_task: list[bool] = []
        self.waits: dict[bytes, asyncio.Event] = {}
        self.fails: set[bytes] = set()
        self.cancelled: list[bytes] = []

    async def __call__(self, m: Msg) -> None:
        self.started.append(m.data)
        self.in_task.append(asyncio.current_task() is not None)
        if m.data in self.fails:
            raise ValueError("a broken message")
        if (event := self.waits.get(m.data)) is not None:
            try:
                await event.wait()
            except asyncio.CancelledError:
                self.cancelled.append(m.data)
                raise
        self.done.append(m.data)


def subscription(cb: Recorder, *, inline: bool) -> Subscription:
    return Subscription(Owner(), 1, "s", "", cb, inline=inline)


async def arrive(sub: Subscription, cb: Recorder, *data: bytes) -> list[bytes]:
    """Deliver messages from a loop callback, as the socket does; what was done by the end of
    that callback."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[bytes]] = loop.create_future()

    def socket_callback() -> None:
        for d in data:
            sub._deliver(msg(d))
        done.set_result(list(cb.done))

    loop.call_soon(socket_callback)
    return await done


async def idle() -> None:
    """A few turns of the loop, no time: the tasks that can run have run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_inline_callback_runs_in_the_delivering_step() -> None:
    for inline in (True, False):
        cb = Recorder()
        sub = subscription(cb, inline=inline)
        assert await arrive(sub, cb, b"1") == ([b"1"] if inline else [])  # a task runs on a later iteration
        await idle()
        assert cb.done == [b"1"] and cb.in_task == [not inline]
        assert sub.handled == 1 and sub.handling is None


async def test_a_waiting_callback_goes_on_in_a_task_and_later_messages_queue_behind_it() -> None:
    cb = Recorder()
    cb.waits[b"1"] = asyncio.Event()
    sub = subscription(cb, inline=True)
    await arrive(sub, cb, b"1", b"2", b"3")
    await idle()
    assert cb.started == [b"1"] and sub.handling is not None  # 2 and 3 wait their turn
    waiter = asyncio.get_running_loop().create_task(sub.handled_upto(3))
    await idle()
    assert not waiter.done()
    cb.waits[b"1"].set()
    await asyncio.wait_for(waiter, 2)
    assert cb.done == [b"1", b"2", b"3"] and sub.handled == 3 and sub.handling is None
    assert (await arrive(sub, cb, b"4"))[-1] == b"4"  # idle again: inline again
    assert cb.in_task == [False, True, True, False]


async def test_a_failing_callback_does_not_stop_the_subscription() -> None:
    cb = Recorder()
    cb.fails.add(b"1")
    sub = subscription(cb, inline=True)
    assert await arrive(sub, cb, b"1") == []
    assert await arrive(sub, cb, b"2") == [b"2"]
    assert cb.started == [b"1", b"2"] and sub.handled == 2 and sub.handling is None


async def test_cancelling_a_resumed_callback_cancels_what_it_waits_for_and_the_subscription_goes_on() -> None:
    cb = Recorder()
    cb.waits[b"1"] = asyncio.Event()
    sub = subscription(cb, inline=True)
    await arrive(sub, cb, b"1")
    task = sub.handling
    assert task is not None
    await idle()
    task.cancel()
    await asyncio.wait([task], timeout=2)
    assert cb.cancelled == [b"1"] and sub.handling is None
    assert await arrive(sub, cb, b"2") == [b"2"]


async def test_what_a_callback_sets_in_a_context_variable_stays_its_own() -> None:
    seen: list[str] = []

    async def cb(m: Msg) -> None:
        seen.append(VAR.get())
        VAR.set(m.data.decode())
        await asyncio.sleep(0)  # goes on in a task: the same context as its first step
        seen.append(VAR.get())

    sub = Subscription(Owner(), 1, "s", "", cb, inline=True)
    sub._deliver(msg(b"a"))
    await idle()
    sub._deliver(msg(b"b"))
    await idle()
    assert seen == ["unset", "a", "unset", "b"] and VAR.get() == "unset"


async def test_an_inline_message_never_overtakes_one_that_arrived_before_it_on_another_subscription(
    nats_url: str,
) -> None:
    """A Cancel (on a subscription that is not inline) arrives just before its job (inline) in the
    same read: the cancel is handled first, as with task delivery."""
    subjects = f"inline.{uuid.uuid4().hex}.cancel", f"inline.{uuid.uuid4().hex}.jobs"
    receiver, sender = await Wire.connect(nats_url, name="r"), await Wire.connect(nats_url, name="s")
    order: list[str] = []

    async def on_cancel(m: Msg) -> None:
        order.append("cancel " + m.data.decode())

    async def on_job(m: Msg) -> None:
        order.append("job " + m.data.decode())

    try:
        await receiver.subscribe(subjects[0], cb=on_cancel)
        await receiver.subscribe(subjects[1], cb=on_job, inline=True)
        await receiver.flush()
        for i in range(20):
            sender.publish_nowait(subjects[0], str(i).encode())  # written together: one read
            sender.publish_nowait(subjects[1], str(i).encode())
        await sender.flush()
        await until(lambda: len(order) >= 40, 2, "the 40 messages handled")
        assert order == [f"{kind} {i}" for i in range(20) for kind in ("cancel", "job")]
    finally:
        await receiver.close()
        await sender.close()


@pytest.mark.parametrize("inline", [True, False])
async def test_over_a_real_server_messages_arrive_in_order(nats_url: str, inline: bool) -> None:
    subject = f"inline.{uuid.uuid4().hex}"
    receiver, sender = await Wire.connect(nats_url, name="r"), await Wire.connect(nats_url, name="s")
    cb = Recorder()
    cb.waits[b"3"] = asyncio.Event()
    try:
        await receiver.subscribe(subject, cb=cb, inline=inline)
        await receiver.flush()
        for i in range(1, 8):
            await sender.publish(subject, str(i).encode())
        await sender.flush()
        await until(lambda: len(cb.started) >= 3, 2, "the third message's callback started")
        cb.waits[b"3"].set()
        await until(lambda: len(cb.done) >= 7, 2, "the 7 messages handled")
        assert cb.done == [str(i).encode() for i in range(1, 8)]
        assert cb.in_task[0] is not inline  # the first reached an idle subscription
    finally:
        await receiver.close()
        await sender.close()
