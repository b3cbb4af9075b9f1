"""How ``Wire`` hands messages to subscribers: a failing callback not stopping later messages, a
slow one delaying only its own subscription, unsubscribe stopping delivery, drain waiting for the
callback in progress before closing, and frames parsed the same at any cut (no server)."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.aio.client import Client as NATS

from services.common.nats_frames import header_block
from services.common.wire import Msg, Subscription, Wire
from services.common.wire_protocol import LinkProtocol
from tests.common.wire_support import Collector, Connect, Seen, quiet


# the callback contract ------------------------------------------------------------------
async def test_a_failing_callback_does_not_stop_later_messages(wire: Wire, subject: str) -> None:
    col = Collector()

    async def cb(msg: Msg) -> None:
        if msg.data.startswith(b"boom"):
            raise RuntimeError("the handler failed")
        await col.record(msg)

    await wire.subscribe(subject, cb=cb)
    for p in (b"boom1", b"one", b"boom2", b"two"):
        await wire.publish(subject, p)
    await col.wait(2)
    assert col.data == [b"one", b"two"]


async def test_a_slow_callback_delays_only_its_own_subscription(wire: Wire, subject: str) -> None:
    gate, other_seen = asyncio.Event(), asyncio.Event()
    started: list[bytes] = []
    done = Collector()

    async def slow(msg: Msg) -> None:
        started.append(msg.data)
        if msg.data == b"a1":
            await gate.wait()
        await done.record(msg)

    async def other(msg: Msg) -> None:
        other_seen.set()

    slow_sub = await wire.subscribe(f"{subject}.a", cb=slow)
    await wire.subscribe(f"{subject}.b", cb=other)
    await wire.publish(f"{subject}.a", b"a1")
    await wire.publish(f"{subject}.a", b"a2")
    await wire.publish(f"{subject}.b", b"b1")
    async with asyncio.timeout(5):
        await other_seen.wait()  # handled while a1's callback is still waiting
    assert slow_sub.delivered == 2 and started == [b"a1"] and done.seen == []  # a2 is here, waiting its turn
    gate.set()
    await done.wait(2)
    assert started == done.data == [b"a1", b"a2"]


# unsubscribe and drain ------------------------------------------------------------------
async def test_unsubscribe_stops_delivery(wire: Wire, nc: NATS, subject: str) -> None:
    col = Collector()
    sub = await wire.subscribe(subject, cb=col.record)
    await wire.flush()  # the server has the SUB before another connection publishes
    await nc.publish(subject, b"before")
    await col.wait(1)
    await sub.unsubscribe()
    await wire.flush()  # the server has the UNSUB
    await nc.publish(subject, b"after")
    await nc.flush()  # ... and routed "after" (to nobody)
    await quiet(wire)
    assert col.data == [b"before"]
    with pytest.raises(nats.errors.NoRespondersError):  # the server itself has no interest left
        await nc.request(subject, b"anyone?", timeout=2)


async def test_drain_waits_for_the_callback_then_closes(connect: Connect, subject: str) -> None:
    drained = await connect()
    gate, first = asyncio.Event(), asyncio.Event()
    handled: list[bytes] = []

    async def cb(msg: Msg) -> None:
        first.set()
        await gate.wait()
        handled.append(msg.data)

    await drained.subscribe(subject, cb=cb)
    await drained.publish(subject, b"m1")
    await drained.publish(subject, b"m2")
    await drained.flush()
    async with asyncio.timeout(5):
        await first.wait()
    draining = asyncio.get_running_loop().create_task(drained.drain())
    finished, _ = await asyncio.wait({draining}, timeout=0.2)
    assert not finished and handled == []  # drain waits on the callback in progress
    gate.set()
    async with asyncio.timeout(5):
        await draining
    assert handled == [b"m1", b"m2"] and drained.is_closed and not drained.is_connected
    with pytest.raises(nats.errors.ConnectionClosedError):
        await drained.publish(subject, b"late")


# parsing (no server) --------------------------------------------------------------------
class Recorder(Subscription):
    """A subscription that records each message as the parser hands it over."""

    def __init__(self, wire: Wire, sid: int, out: list[tuple[int, Seen]]) -> None:
        super().__init__(wire, sid, "a.>", "", None)
        self.out = out

    def _deliver(self, msg: Msg) -> None:
        self.out.append((self.sid, Seen(msg.subject, msg.reply, msg.data, msg.headers)))


def frame(sid: int, m: Seen) -> bytes:
    """A MSG (or, with headers, HMSG) frame as the server sends it."""
    to = f"{m.subject} {sid} {m.reply}" if m.reply else f"{m.subject} {sid}"
    if m.headers is None:
        return f"MSG {to} {len(m.data)}\r\n".encode() + m.data + b"\r\n"
    block = header_block(m.headers)
    return f"HMSG {to} {len(block)} {len(block) + len(m.data)}\r\n".encode() + block + m.data + b"\r\n"


async def test_frames_parse_the_same_at_any_cut() -> None:
    wire = Wire(["nats://127.0.0.1:1"])
    out: list[tuple[int, Seen]] = []
    wire._subs = {1: Recorder(wire, 1, out), 2: Recorder(wire, 2, out)}
    expected = [
        (1, Seen("a.one", "", b"hello", None)),
        (2, Seen("a.two", "_INBOX.r1", b"he\r\nllo\r\n", None)),
        (1, Seen("a.empty", "", b"", None)),
        (1, Seen("a.three", "", b"MSG a.fake 1 3\r\nxyz", {"K": "v", "Trace-Id": "t 1"})),
        (2, Seen("a.four", "reply.to", b"", {"X": "y"})),
        (1, Seen("a.five", "_INBOX.r2", b"\x00\xff\r\n", {"H": "1"})),
    ]
    one, two, empty, three, four, five = (frame(*e) for e in expected)
    nobody = frame(9, Seen("a.nobody", "", b"unsubscribed", None))  # no such subscription: dropped
    stream = one + two + b"PING\r\n" + empty + three + nobody + four + b"+OK\r\n" + five
    cuts: list[list[bytes]] = [[stream[:i], stream[i:]] for i in range(len(stream) + 1)]
    cuts.append([stream[i : i + 1] for i in range(len(stream))])  # a byte at a time
    cuts.append([stream[i : i + 7] for i in range(0, len(stream), 7)])
    for chunks in cuts:
        proto = LinkProtocol(wire._message, wire._control, wire._connection_lost)
        for chunk in chunks:
            proto.data_received(chunk)
        assert out == expected, [len(c) for c in chunks]
        assert bytes(wire._pending) == b"PONG\r\n"  # the PING was answered (queued: not connected)
        out.clear()
        wire._pending.clear()
