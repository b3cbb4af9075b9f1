"""``Wire``'s connection upkeep at its edges, against scripted servers on loopback (asyncio
servers speaking just enough NATS): a lame duck move in detail (what reaches which server, a
flush across the move), lame duck mode with no other server, and a connection lost while the
reconnected hook runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.common.wire import Wire
from tests.common.wire_support import Hooks
from tests.waiting import until


class Scripted:
    """A server sending INFO, answering each PING, recording what it reads; ``on_data(server,
    connection number, writer)`` runs after each read."""

    def __init__(self, on_data: Callable[[Scripted, int, asyncio.StreamWriter], None] | None = None) -> None:
        self.on_data = on_data
        self.received = b""
        self.connections = 0
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def info(self, writer: asyncio.StreamWriter, **fields: Any) -> None:
        info = {"server_id": "scripted", "version": "2.10.0", "max_payload": 1048576, "headers": True, **fields}
        writer.write(b"INFO " + json.dumps(info).encode() + b"\r\n")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        self.info(writer)
        while data := await reader.read(65536):
            self.received += data
            writer.write(b"PONG\r\n" * data.count(b"PING\r\n"))
            if self.on_data is not None:
                self.on_data(self, number, writer)

    def close(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[..., Any]]:
    servers: list[Scripted] = []

    async def start(on_data: Callable[[Scripted, int, asyncio.StreamWriter], None] | None = None) -> Scripted:
        server = await Scripted(on_data).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


async def test_a_lame_duck_move_flushes_the_old_server_and_sends_the_rest_to_the_new(
    scripted: Callable[..., Any],
) -> None:
    new = await scripted()

    def lame_duck_on_first_publish(server: Scripted, number: int, writer: asyncio.StreamWriter) -> None:
        if b"one" in server.received and b"ldm" not in server.received:
            server.received += b"ldm"  # once
            server.info(writer, ldm=True, connect_urls=[f"127.0.0.1:{new.port}"])

    old = await scripted(lame_duck_on_first_publish)
    hooks = Hooks()
    wire = await Wire.connect(old.url, ping_interval=100, **hooks.options)
    try:
        await wire.subscribe("a.b")
        await wire.publish("a.b", b"one")
        async with asyncio.timeout(3):
            await hooks.disconnected.wait()
        await wire.publish("a.b", b"two")  # during the move: waits for the next server
        flushed = asyncio.get_running_loop().create_task(wire.flush(timeout=3))
        async with asyncio.timeout(3):
            await hooks.reconnected.wait()
            await flushed  # a flush across the move is answered by the new server
        assert hooks.calls == ["disconnected", "reconnected"] and wire.pool.current is not None
        assert wire.pool.current.port == new.port and wire.is_connected
        assert b"one" in old.received and b"two" not in old.received
        assert old.received.count(b"PING") >= 2  # the handshake's and the move's flush
        sent_new = new.received
        assert sent_new.index(b"SUB a.b 1") < sent_new.index(b"PUB a.b 3\r\ntwo") < sent_new.rindex(b"PING")
    finally:
        await wire.close()


async def test_lame_duck_mode_with_no_other_server_keeps_the_connection(scripted: Callable[..., Any]) -> None:
    def lame_duck(server: Scripted, number: int, writer: asyncio.StreamWriter) -> None:
        if b"one" in server.received and b"ldm" not in server.received:
            server.received += b"ldm"
            server.info(writer, ldm=True)

    only = await scripted(lame_duck)
    hooks = Hooks()
    wire = await Wire.connect(only.url, ping_interval=100, **hooks.options)
    try:
        await wire.publish("a.b", b"one")
        await wire.flush()
        await asyncio.sleep(0.1)  # a sleep, not a wait: time for a wrong move (there is nowhere to go)
        await wire.publish("a.b", b"two")
        await wire.flush()
        assert wire.is_connected and hooks.calls == [] and b"two" in only.received and only.connections == 1
    finally:
        await wire.close()


async def test_a_connection_lost_while_the_reconnected_hook_runs_is_made_again(scripted: Callable[..., Any]) -> None:
    def drop_the_first_two(server: Scripted, number: int, writer: asyncio.StreamWriter) -> None:
        if number <= 2 and b"CONNECT" in server.received:
            asyncio.get_running_loop().call_later(0.1, writer.transport.abort)

    flaky = await scripted(drop_the_first_two)
    hooks = Hooks(reconnected_wait=0.3)  # the second connection drops while this waits
    wire = await Wire.connect(flaky.url, reconnect_time_wait=0.05, ping_interval=100, **hooks.options)
    try:
        await until(
            lambda: flaky.connections >= 3 and wire.is_connected,
            5,
            "a third connection (the server's side: no event of ours)",
        )
        assert hooks.calls[:4] == ["disconnected", "reconnected", "disconnected", "reconnected"]
        await wire.publish("a.b", b"back")
        await wire.flush()
        assert b"back" in flaky.received
    finally:
        await wire.close()
