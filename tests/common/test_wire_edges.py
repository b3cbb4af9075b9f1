"""``Wire`` at the edges a review found: PONGs matched to their own PING after a flush timed
out, a stream broken in the handshake's last read, draining without losing what the server had
sent, and close() while the server has stopped reading. The misbehaving servers are scripted
sockets on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import nats.errors
import pytest

from services.common.wire import Msg, Wire

INFO = b'INFO {"server_id":"fake","version":"2.10.0","max_payload":1048576,"headers":true}\r\n'


def handshake(conn: socket.socket) -> None:
    """INFO, then read until the client's CONNECT and PING, and answer the PING."""
    conn.sendall(INFO)
    buf = b""
    while b"PING\r\n" not in buf:
        buf += conn.recv(4096)


def quietly(script: Callable[[socket.socket], None], conn: socket.socket) -> None:
    """A script whose client went away (or the test ended) just stops."""
    with contextlib.suppress(OSError):
        script(conn)


@pytest.fixture
def fake_server() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """``start(script)``: a loopback port whose every connection runs ``script`` in a thread."""
    sockets: list[socket.socket] = []

    def start(script: Callable[[socket.socket], None]) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        sockets.append(listener)

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                sockets.append(conn)
                threading.Thread(target=quietly, args=(script, conn), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for s in sockets:
        s.close()


async def test_a_timed_out_flush_does_not_answer_the_next_one(
    fake_server: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    """Each PONG answers its own PING: a flush that gave up leaves no waiter that would make
    the next flush return on the earlier PING's PONG."""

    def slow_pongs(conn: socket.socket) -> None:
        handshake(conn)
        conn.sendall(b"PONG\r\n")
        while data := conn.recv(4096):
            for _ in range(data.count(b"PING\r\n")):
                time.sleep(0.3)  # a busy server: each PONG 300 ms after its PING
                conn.sendall(b"PONG\r\n")

    wire = await Wire.connect(f"nats://127.0.0.1:{fake_server(slow_pongs)}", ping_interval=100)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await wire.flush(timeout=0.1)
        started = time.monotonic()
        await wire.flush(timeout=2)  # its PONG comes after the first PING's (~300 ms) and its own
        assert time.monotonic() - started > 0.45
    finally:
        await wire.close()


async def test_a_stream_broken_in_the_handshakes_last_read_is_reconnected(
    fake_server: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    """A reconnect whose PONG comes in one read with an unreadable frame: that connection is
    dropped as it is made, and the client connects again instead of believing itself
    connected on a dead one."""
    accepted: list[int] = []

    def script(conn: socket.socket) -> None:
        accepted.append(1)
        handshake(conn)
        if len(accepted) == 2:
            conn.sendall(b"PONG\r\nMSG a.b 1 not-a-size\r\n")  # broken as it is made
        else:
            conn.sendall(b"PONG\r\n")
        if len(accepted) == 1:
            time.sleep(0.2)  # the server's script: the client connected a moment, then the loss
            conn.close()  # the first connection is lost: reconnect
            return
        while conn.recv(4096):
            pass

    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    wire = await Wire.connect(
        f"nats://127.0.0.1:{fake_server(script)}",
        reconnect_time_wait=0.05,
        ping_interval=0.2,
        reconnected_cb=on_reconnect,
    )
    try:
        async with asyncio.timeout(5):
            await reconnected.wait()
        assert len(accepted) == 3 and wire.is_connected
    finally:
        await wire.close()


async def test_close_releases_a_publisher_held_by_a_stalled_server(
    fake_server: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    def stalled(conn: socket.socket) -> None:
        handshake(conn)
        conn.sendall(b"PONG\r\n")
        time.sleep(30)  # then reads nothing more

    wire = await Wire.connect(f"nats://127.0.0.1:{fake_server(stalled)}", ping_interval=100)

    async def pump() -> None:
        for _ in range(200):
            await wire.publish("a.b", b"x" * 1_000_000)

    publisher = asyncio.get_running_loop().create_task(pump())
    await asyncio.sleep(0.3)  # a sleep, not a wait: the publisher must not get through in it
    assert not publisher.done()  # held by back-pressure
    await wire.close()
    async with asyncio.timeout(3):
        with pytest.raises(nats.errors.ConnectionClosedError):
            await publisher


async def test_draining_handles_what_the_server_had_already_sent(nats_url: str) -> None:
    """A queue subscription left with ``drain`` (a service draining): the messages the server
    had sent before the UNSUB are handled, none dropped. (The publisher is a Wire: nats-py's
    flush writes its PING ahead of publishes still in its buffer, so it proves nothing here.)"""
    wire = await Wire.connect(nats_url)
    publisher = await Wire.connect(nats_url)
    subject = f"drain.{uuid.uuid4().hex}"
    handled: list[bytes] = []
    first = asyncio.Event()

    async def on(msg: Msg) -> None:
        handled.append(msg.data)
        first.set()

    try:
        sub = await wire.subscribe(subject, queue="workers", cb=on)
        await wire.flush()
        for i in range(5000):
            await publisher.publish(subject, b"%d" % i)
        await publisher.flush()
        await first.wait()
        await sub.drain(timeout=10)
        assert len(handled) == 5000 and handled[-1] == b"4999"
    finally:
        await publisher.close()
        await wire.close()
