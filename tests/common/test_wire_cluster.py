"""``Wire`` on a three-node nats-server cluster (``-cluster`` / ``-routes`` on loopback): the
cluster's servers learnt from INFO, a node killed under a stream of numbered messages, a dead
node in the URL skipped, and a node in lame duck mode left without losing a message."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats.errors
import pytest

from services.common.infra import free_port
from services.common.wire import Msg, NoServersAnswered, Wire
from tests.common.test_wire_servers import NatsServers, Node, nats_servers
from tests.common.wire_support import Collector, Hooks
from tests.waiting import until

__all__ = ["nats_servers"]  # the fixture, shared

Connect = Callable[..., Awaitable[Wire]]
COUNT = 1000


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    opened: list[Wire] = []

    async def open_wire(url: str, **options: Any) -> Wire:
        wire = await Wire.connect(url, **{"reconnect_time_wait": 0.25, "dont_randomize": True, **options})
        opened.append(wire)
        return wire

    yield open_wire
    for wire in opened:
        await wire.close()


def ports(wire: Wire) -> set[int]:
    return {server.port for server in wire.pool.servers}


def on(wire: Wire) -> int:
    assert wire.pool.current is not None and wire.is_connected
    return wire.pool.current.port


async def learnt_all(wire: Wire, nodes: list[Node], timeout: float = 10.0) -> None:
    """Until ``wire`` knows every node (the cluster forms after its nodes start: later INFOs)."""
    everyone = {node.port for node in nodes}
    await until(
        lambda: ports(wire) == everyone,
        timeout,
        lambda: f"the wire knowing every node, {sorted(everyone)} (it knows {sorted(ports(wire))})",
    )


async def listening(publisher: Wire, subscriber: Wire, subject: str) -> None:
    """Until the publisher's node routes ``subject`` to the subscriber's (interest crosses the
    routes after the SUB): a responder subscribed after it answers through the publisher's node."""

    async def answer(msg: Msg) -> None:
        await msg.respond(b"here")

    ready = await subscriber.subscribe(f"{subject}.ready", cb=answer)

    async def answered() -> bool:
        try:
            await publisher.request(f"{subject}.ready", timeout=0.5)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False
        return True

    await until(answered, 10, f"{subject}'s interest routed to the publisher's node", every=0.02)
    await ready.unsubscribe()


async def stream(publisher: Wire, subject: str, at: int, event: Callable[[], Awaitable[None]]) -> None:
    """``COUNT`` numbered messages, about one a millisecond; ``event`` before message ``at``."""
    for i in range(COUNT):
        if i == at:
            await event()
        await publisher.publish(subject, str(i).encode())
        await asyncio.sleep(0.001)  # pacing: a stream under way when the event comes


def received_in_order(col: Collector) -> None:
    assert col.data == [str(i).encode() for i in range(COUNT)], (
        len(col.data),
        [int(d) for d in col.data[:3]],
        sorted({i for i in range(COUNT)} - {int(d) for d in col.data})[:20],
    )


async def test_a_wire_given_one_node_learns_the_others(nats_servers: NatsServers, connect: Connect) -> None:
    """From the INFO of its connection, and from the INFOs the server sends as nodes join."""
    (port, args), *others = nats_servers.plan(3)
    first = await nats_servers.start(port=port, args=args)
    wire = await connect(first.url)
    assert ports(wire) == {first.port}  # alone so far
    nodes = [first] + [await nats_servers.start(port=port, args=args) for port, args in others]
    await learnt_all(wire, nodes)
    assert on(wire) == first.port
    assert [s.discovered for s in wire.pool.servers] == [False, True, True]
    late = await connect(nodes[1].url)  # a node's first INFO lists the cluster
    await learnt_all(late, nodes, timeout=0.5)


async def test_a_killed_node_is_replaced_and_nothing_published_is_lost(
    nats_servers: NatsServers, connect: Connect
) -> None:
    """The publisher's node is SIGKILLed mid-stream; the subscriber, on another node, gets every
    message once and in order. The kill lands between two messages: a message written to a
    server in the instant it dies is lost with any NATS client (TCP does not tell which bytes the
    dead process read); what ``Wire`` guarantees is that everything published from the moment
    the loss is seen waits for the next server and is sent there, in order."""
    nodes = await nats_servers.cluster()
    hooks = Hooks()
    publisher = await connect(nodes[0].url, **hooks.options)
    subscriber = await connect(nodes[1].url)
    await learnt_all(publisher, nodes)
    subject = f"cluster.{uuid.uuid4().hex}"
    col = Collector()
    await subscriber.subscribe(subject, cb=col.record)
    await listening(publisher, subscriber, subject)

    async def kill() -> None:
        nodes[0].signal(signal.SIGKILL)
        await nodes[0].dead()

    await stream(publisher, subject, COUNT // 3, kill)
    await col.wait(COUNT, timeout=10)
    received_in_order(col)
    gaps = [later - earlier for earlier, later in zip(col.times, col.times[1:], strict=False)]
    assert max(gaps) < 3.0, max(gaps)
    assert hooks.calls == ["disconnected", "reconnected"] and on(publisher) in {nodes[1].port, nodes[2].port}
    await asyncio.sleep(0.2)  # a sleep, not a wait: no message may arrive a second time in it
    assert len(col.data) == COUNT  # and nothing twice


async def test_a_subscriber_follows_its_killed_node(nats_servers: NatsServers, connect: Connect) -> None:
    """The subscriber's node dies: it resubscribes on another and gets what is published after."""
    nodes = await nats_servers.cluster()
    hooks = Hooks()
    subscriber = await connect(nodes[0].url, **hooks.options)
    publisher = await connect(nodes[1].url)
    await learnt_all(subscriber, nodes)
    subject = f"cluster.{uuid.uuid4().hex}"
    col = Collector()
    await subscriber.subscribe(subject, cb=col.record)
    await listening(publisher, subscriber, subject)
    nodes[0].signal(signal.SIGKILL)
    async with asyncio.timeout(3):
        await hooks.reconnected.wait()
    await listening(publisher, subscriber, subject)
    await publisher.publish(subject, b"after")
    await col.wait(1)
    assert col.data == [b"after"]


async def test_a_dead_node_in_the_list_is_skipped(nats_servers: NatsServers, connect: Connect) -> None:
    nodes = await nats_servers.cluster()
    dead = free_port()
    wire = await connect(f"nats://127.0.0.1:{dead},{nodes[1].url}")
    assert on(wire) == nodes[1].port
    gone = [free_port(), free_port()]
    with pytest.raises(NoServersAnswered) as none:
        await Wire.connect(",".join(f"nats://127.0.0.1:{p}" for p in gone), dont_randomize=True)
    assert str(none.value) == (
        f"nats: no server could be connected to: nats://127.0.0.1:{gone[0]}: connection refused; "
        f"nats://127.0.0.1:{gone[1]}: connection refused"
    )


async def test_lame_duck_mode_moves_the_client_without_losing_a_message(
    nats_servers: NatsServers, connect: Connect
) -> None:
    """``nats-server --signal ldm`` is SIGUSR2: the server says ``ldm`` in an INFO and stops
    taking clients; the publisher on it moves to another node mid-stream, calling its hooks."""
    nodes = await nats_servers.cluster()
    hooks = Hooks()
    publisher = await connect(nodes[0].url, **hooks.options)
    subscriber = await connect(nodes[1].url)
    await learnt_all(publisher, nodes)
    subject = f"cluster.{uuid.uuid4().hex}"
    col = Collector()
    await subscriber.subscribe(subject, cb=col.record)
    await listening(publisher, subscriber, subject)

    async def lame_duck() -> None:
        nodes[0].signal(signal.SIGUSR2)

    await stream(publisher, subject, COUNT // 3, lame_duck)
    await col.wait(COUNT, timeout=10)
    received_in_order(col)
    assert hooks.calls == ["disconnected", "reconnected"] and on(publisher) in {nodes[1].port, nodes[2].port}
    assert nodes[0].proc.alive() and "lame duck" in nats_servers.log(nodes[0]).lower()
    await asyncio.sleep(0.2)  # a sleep, not a wait: no message may arrive a second time in it
    assert len(col.data) == COUNT
