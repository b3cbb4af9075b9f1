"""``Wire``, the lean NATS client, against the tests' nats-server (and nats-py on the other end,
for interop): payloads and their order, headers (a line break in one refused, nothing sent),
messages both ways with nats-py, queue groups, request/reply. The callback contract, drain and
frame parsing are in test_wire_delivery.py; logins and reconnects in test_wire_connection.py."""

from __future__ import annotations

import asyncio
import os
import time

import nats.errors
import pytest
from nats.aio.client import Client as NATS

from services.common.wire import Msg, Wire
from services.common.wire_subscription import Callback
from tests.common.wire_support import Collector, Connect, Seen, quiet


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
