"""``Wire``, the lean NATS client: pub/sub, headers, queue groups, request/reply, the callback
contract, drain, frame parsing at any cut, auth, reconnects and stale connections, against real
nats-server processes (and nats-py on the other end, for interop)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from services.common.infra import ManagedProcess, free_port, start_nats
from services.common.nats_frames import header_block
from services.common.wire import Msg, Subscription, Wire, _Protocol
from services.common.wire_subscription import Callback

Connect = Callable[..., Awaitable[Wire]]


@dataclass(frozen=True)
class Seen:
    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None


class Collector:
    """A callback (for Wire or nats-py) recording what it gets; ``wait`` for a count."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._changed = asyncio.Event()

    async def record(self, msg: Any) -> None:
        self.seen.append(Seen(msg.subject, msg.reply, msg.data, msg.headers or None))
        self._changed.set()

    async def wait(self, count: int, timeout: float = 5.0) -> list[Seen]:
        async with asyncio.timeout(timeout):
            while len(self.seen) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.seen

    @property
    def data(self) -> list[bytes]:
        return [s.data for s in self.seen]


class Servers:
    """Private nats-servers for one test; all resumed (if SIGSTOPped) and stopped at its end."""

    def __init__(self) -> None:
        self.procs: list[ManagedProcess] = []
        self.pid = 0  # the newest server's

    async def start(self, port: int | None = None, credentials: tuple[str, str] | None = None) -> tuple[int, str]:
        port = port or free_port()
        proc, url = await asyncio.to_thread(start_nats, port, credentials=credentials)
        assert proc.proc is not None
        self.procs.append(proc)
        self.pid = proc.proc.pid
        return port, url

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.proc is not None and proc.alive():
                os.kill(proc.proc.pid, signal.SIGCONT)  # a stopped server would not stop
            proc.stop()


class Hooks:
    """disconnected_cb / reconnected_cb, recording their calls."""

    def __init__(self) -> None:
        self.disconnected, self.reconnected = asyncio.Event(), asyncio.Event()
        self.calls: list[str] = []
        self.options = {"disconnected_cb": self.on_disconnected, "reconnected_cb": self.on_reconnected}

    async def on_disconnected(self) -> None:
        self.calls.append("disconnected")
        self.disconnected.set()

    async def on_reconnected(self) -> None:
        self.calls.append("reconnected")
        self.reconnected.set()


@pytest.fixture
def subject() -> str:
    return f"wiretest.{uuid.uuid4().hex}"


@pytest.fixture
async def connect(nats_url: str) -> AsyncIterator[Connect]:
    opened: list[Wire] = []

    async def open_wire(url: str | None = None, **options: Any) -> Wire:
        wire = await Wire.connect(url or nats_url, **options)
        opened.append(wire)
        return wire

    yield open_wire
    for wire in opened:
        await wire.close()


@pytest.fixture
async def wire(connect: Connect) -> Wire:
    return await connect(name="wire-test")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def servers() -> Iterator[Servers]:
    owned = Servers()
    yield owned  # and after the test, whatever its outcome:
    owned.stop_all()


async def quiet(*wires: Wire) -> None:
    """Every message the server routed to these connections so far has been read and handled."""
    for w in wires:
        await w.flush()
    await asyncio.sleep(0.05)  # a negative check: give callbacks (their tasks) a moment to run


# pub/sub --------------------------------------------------------------------------------
async def test_payloads_round_trip(wire: Wire, subject: str) -> None:
    assert wire.is_connected and wire.max_payload == wire.server_info["max_payload"] > 0
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    big = os.urandom(wire.max_payload - 1)
    payloads = [b"", b"hi", b"\r\nMSG x 1 3\r\nabc\r\n\x00\xff\r\n", big]
    for p in payloads:
        await wire.publish(subject, p)
    assert await col.wait(4) and col.data == payloads
    assert all(s.subject == subject and s.reply == "" and s.headers is None for s in col.seen)
    with pytest.raises(nats.errors.MaxPayloadError):
        await wire.publish(subject, b"x" * (wire.max_payload + 1))


async def test_messages_arrive_in_publish_order(wire: Wire, subject: str) -> None:
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    expected = [str(i).encode() for i in range(500)]
    for p in expected:
        await wire.publish(subject, p)
    await col.wait(500)
    assert col.data == expected


# headers --------------------------------------------------------------------------------
async def test_headers_round_trip(wire: Wire, subject: str) -> None:
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    headers = {"Trace-Id": "abc-123", "X-Spaces": "a b  c", "Chorus-Kind": "x=1;y=2"}
    await wire.publish(subject, b"body\r\nwith crlf", headers=headers)
    (seen,) = await col.wait(1)
    assert seen.headers == headers and seen.data == b"body\r\nwith crlf"


async def test_a_header_with_a_line_break_is_refused_and_nothing_sent(wire: Wire, subject: str) -> None:
    col, injected = Collector(), Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.subscribe(f"{subject}.evil", cb=injected.record)
    for bad in ({"X": f"a\r\nPUB {subject}.evil 1\r\nz"}, {"X": "a\nb"}, {"Bad\r\nName": "v"}, {"a:b": "v"}):
        with pytest.raises(ValueError):
            await wire.publish(subject, b"refused", headers=bad)
    await wire.publish(subject, b"ok")
    await col.wait(1)
    await quiet(wire)
    assert col.data == [b"ok"] and injected.seen == []  # and the stream is intact: "ok" got through


# interop with nats-py -------------------------------------------------------------------
async def test_nats_py_publishes_and_wire_receives(wire: Wire, nc: NATS, subject: str) -> None:
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.flush()
    await nc.publish(subject, b"plain")
    await nc.publish(subject, b"with headers", headers={"Trace-Id": "t-1", "X-Other": "two words"})
    await nc.publish(subject, b"with reply", reply="answer.here")
    await nc.publish(subject, b"both", reply="answer.there", headers={"K": "v"})
    await nc.flush()
    assert await col.wait(4) == [
        Seen(subject, "", b"plain", None),
        Seen(subject, "", b"with headers", {"Trace-Id": "t-1", "X-Other": "two words"}),
        Seen(subject, "answer.here", b"with reply", None),
        Seen(subject, "answer.there", b"both", {"K": "v"}),
    ]


async def test_wire_publishes_and_nats_py_receives(wire: Wire, nc: NATS, subject: str) -> None:
    col = Collector()
    await nc.subscribe(subject, cb=col.record)
    await nc.flush()
    headers = {"Trace-Id": "t-2", "X-Other": "two words"}
    await wire.publish(subject, b"plain")
    await wire.publish(subject, b"with headers", headers=headers)
    await wire.publish(subject, b"with reply", reply="answer.here", headers=headers)
    assert await col.wait(3) == [
        Seen(subject, "", b"plain", None),
        Seen(subject, "", b"with headers", headers),
        Seen(subject, "answer.here", b"with reply", headers),
    ]


# queue groups ---------------------------------------------------------------------------
async def test_queue_group_delivers_each_message_once(connect: Connect, wire: Wire, subject: str) -> None:
    both = Collector()
    takers: list[str] = []

    def member(name: str) -> Callback:
        async def cb(msg: Msg) -> None:
            takers.append(name)
            await both.record(msg)

        return cb

    first, second = await connect(), await connect()
    await first.subscribe(subject, queue="workers", cb=member("first"))
    await second.subscribe(subject, queue="workers", cb=member("second"))
    await first.flush()
    await second.flush()
    expected = {str(i).encode() for i in range(200)}
    for p in sorted(expected):
        await wire.publish(subject, p)
    await both.wait(200)
    await wire.flush()
    await quiet(first, second)
    assert len(both.seen) == 200 and set(both.data) == expected  # each once, none lost
    assert set(takers) == {"first", "second"}  # both members took some


# request/reply --------------------------------------------------------------------------
async def test_request_gets_the_responders_answer(connect: Connect, wire: Wire, subject: str) -> None:
    responder = await connect()

    async def answer(msg: Msg) -> None:
        await msg.respond(b"re:" + msg.data)

    await responder.subscribe(subject, cb=answer)
    await responder.flush()
    reply = await wire.request(subject, b"ping", timeout=2)
    assert reply.data == b"re:ping"
    replies = await asyncio.gather(*(wire.request(subject, str(i).encode(), timeout=5) for i in range(50)))
    assert [r.data for r in replies] == [f"re:{i}".encode() for i in range(50)]


async def test_request_without_responders_fails_fast(wire: Wire, subject: str) -> None:
    started = time.monotonic()
    with pytest.raises(nats.errors.NoRespondersError):
        await wire.request(subject, b"anyone?", timeout=5)
    assert time.monotonic() - started < 1.0


async def test_request_times_out_when_nobody_answers(wire: Wire, subject: str) -> None:
    silent = Collector()
    await wire.subscribe(subject, cb=silent.record)
    started = time.monotonic()
    with pytest.raises(nats.errors.TimeoutError):
        await wire.request(subject, b"hello?", timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 1.0
    assert silent.data == [b"hello?"]


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
        proto = _Protocol(wire)
        for chunk in chunks:
            proto.data_received(chunk)
        assert out == expected, [len(c) for c in chunks]
        assert bytes(wire._pending) == b"PONG\r\n"  # the PING was answered (queued: not connected)
        out.clear()
        wire._pending.clear()


# auth -----------------------------------------------------------------------------------
async def test_user_and_password(servers: Servers, connect: Connect, subject: str) -> None:
    user, password = 'chorus "svc" user', 'p a\'ss "w" d'
    port, url = await servers.start(credentials=(user, password))
    wire = await connect(url, user=user, password=password)
    in_url = await connect(f"nats://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{port}")
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.flush()
    await in_url.publish(subject, b"authorised")
    assert (await col.wait(1))[0].data == b"authorised"
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    for wrong in ({"user": user, "password": "wrong"}, {}):
        with pytest.raises(nats.errors.NoServersError) as refused:
            await Wire.connect(url, error_cb=on_error, **wrong)
        assert "Authorization Violation" in str(refused.value.__cause__)
    assert errors and all("Authorization Violation" in str(e) for e in errors)


# keeping the connection -----------------------------------------------------------------
async def test_reconnects_resubscribes_and_sends_what_was_published_meanwhile(
    servers: Servers, connect: Connect, subject: str
) -> None:
    port, url = await servers.start()
    hooks = Hooks()
    wire = await connect(url, reconnect_time_wait=0.1, **hooks.options)
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.publish(subject, b"before")
    await col.wait(1)
    os.kill(servers.pid, signal.SIGKILL)
    async with asyncio.timeout(5):
        await hooks.disconnected.wait()
    assert not wire.is_connected and not wire.is_closed
    await wire.publish(subject, b"while down")  # queued, not an error
    await servers.start(port)
    async with asyncio.timeout(5):
        await hooks.reconnected.wait()
    assert wire.is_connected and hooks.calls == ["disconnected", "reconnected"]
    await col.wait(2)  # sent after the reconnect, to the subscription made again
    other = await nats.connect(url)
    try:
        await other.publish(subject, b"after")
        await other.flush()
    finally:
        await other.close()
    await col.wait(3)
    assert col.data == [b"before", b"while down", b"after"]
    await wire.flush()


async def test_a_stale_connection_is_noticed_and_replaced(servers: Servers, connect: Connect, subject: str) -> None:
    _, url = await servers.start()
    hooks = Hooks()
    wire = await connect(url, ping_interval=0.2, max_outstanding_pings=2, reconnect_time_wait=0.1, **hooks.options)
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.flush()
    os.kill(servers.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        async with asyncio.timeout(3):
            await hooks.disconnected.wait()
        assert 0.3 <= time.monotonic() - stopped <= 2.0  # after unanswered PINGs, not at once
        assert not wire.is_connected
    finally:
        os.kill(servers.pid, signal.SIGCONT)
    async with asyncio.timeout(10):
        await hooks.reconnected.wait()
    await wire.publish(subject, b"back")
    assert (await col.wait(1))[0].data == b"back"
    await wire.flush()
