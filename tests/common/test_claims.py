"""``Claims`` (``claims.py``) against real nats-servers with JetStream, over ``Wire``: round
trips from 0 bytes to several chunks, puts at the same time, delete and expiry, an existing
stream brought to the claims' settings, the API's errors, a server without JetStream (or
silent), and a three-node cluster losing the node that holds the claim's stream leader."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from services.common.claims import (
    ClaimError,
    ClaimMissing,
    Claims,
    ClaimTimeout,
    JetStreamError,
    JetStreamUnavailable,
    Key,
)
from services.common.wire import Msg, Wire
from tests.common.test_wire_servers import NatsServers, Node, nats_servers
from tests.common.wire_support import Connect
from tests.waiting import until

__all__ = ["nats_servers"]  # the fixture, shared

STREAM = "CLAIMS_test"


def jetstream(directory: Path, name: str, extra: str = "") -> str:
    """A server's configuration: its name (a cluster's JetStream needs one) and a store."""
    store = directory / f"store-{name}"
    return f"server_name: {name}\njetstream {{ store_dir: {json.dumps(str(store))} }}\n{extra}"


@pytest.fixture
def connect(connect: Connect) -> Connect:
    """The common connections (closed after the test), reconnecting after 0.25 s."""

    async def open_wire(url: str, **options: Any) -> Wire:
        return await connect(url, **{"reconnect_time_wait": 0.25, **options})

    return open_wire


@pytest.fixture
async def node(nats_servers: NatsServers, tmp_path: Path) -> Node:
    return await nats_servers.start(jetstream(tmp_path, "solo"))


async def api(wire: Wire, what: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JetStream API request made by the test itself."""
    reply = await wire.request(f"$JS.API.{what}", json.dumps(body).encode() if body else b"", timeout=5)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


async def seq(wire: Wire, claims: Claims, key: str, i: int) -> int:
    """The stream sequence of chunk ``i``."""
    subject = f"{claims.prefix}.{Key.parse(key).id}.{i}"
    answer = await api(wire, f"STREAM.MSG.GET.{claims.stream}", {"last_by_subj": subject})
    return int(answer["message"]["seq"])


# one server ---------------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["0", "1", "max_payload", "5MB"])
async def test_round_trip(node: Node, connect: Connect, size: str) -> None:
    wire = await connect(node.url)
    claims = Claims(wire, STREAM)
    n = {"0": 0, "1": 1, "max_payload": wire.max_payload, "5MB": 5 * 1024 * 1024}[size]
    data = os.urandom(n)  # random: chunks out of order would not compare equal
    key = await claims.put(data)
    assert await claims.get(key) == data
    count = Key.parse(key).count
    assert count == max(1, math.ceil(n / claims.chunk_size))
    assert count >= (6 if size == "5MB" else 1)
    info = await api(wire, f"STREAM.INFO.{STREAM}")
    assert info["state"]["messages"] == count
    config = info["config"]
    assert config["subjects"] == [f"$CLAIMS.{STREAM}.>"]
    assert (config["storage"], config["discard"], config["num_replicas"]) == ("file", "old", 1)
    assert config["max_age"] == 600 * 10**9


async def test_concurrent_puts_do_not_mix_chunks(nats_servers: NatsServers, tmp_path: Path, connect: Connect) -> None:
    node = await nats_servers.start(jetstream(tmp_path, "small", "max_payload: 65536"))
    writer, reader = await connect(node.url), await connect(node.url)
    claims = Claims(writer, STREAM)
    assert writer.max_payload == 65536
    payloads = [os.urandom(claims.chunk_size * 5 + 100 * i + 1) for i in range(8)]
    async with asyncio.TaskGroup() as tg:
        puts = [tg.create_task(claims.put(data)) for data in payloads]
    keys = [put.result() for put in puts]
    assert all(Key.parse(key).count == 6 for key in keys)
    seqs = [[await seq(writer, claims, key, i) for i in range(6)] for key in keys]
    assert any(s[-1] - s[0] > 5 for s in seqs)  # the chunks did interleave in the stream
    other = Claims(reader, STREAM)  # another connection reads them (as a receiving service)
    async with asyncio.TaskGroup() as tg:
        gets = [tg.create_task(other.get(key)) for key in keys]
    assert [get.result() for get in gets] == payloads


async def test_get_after_delete_is_missing(node: Node, connect: Connect) -> None:
    claims = Claims(await connect(node.url), STREAM)
    key = await claims.put(os.urandom(2 * claims.chunk_size + 7))
    other = await claims.put(b"kept")
    await claims.delete(key)
    with pytest.raises(ClaimMissing):
        await claims.get(key)
    await claims.delete(key)  # again: nothing to do, no error
    assert await claims.get(other) == b"kept"


async def test_unknown_keys_are_missing(node: Node, connect: Connect) -> None:
    claims = Claims(await connect(node.url), STREAM)
    with pytest.raises(ClaimMissing):  # no stream yet
        await claims.get(f"{'a' * 32}.1.4")
    await claims.put(b"made")
    with pytest.raises(ClaimMissing):
        await claims.get(f"{'a' * 32}.1.4")
    for key in ("", "nonsense", f"{'a' * 32}.0.0", f"{'a' * 32}.1", "$CLAIMS.x.>"):
        with pytest.raises(ClaimMissing):
            await claims.get(key)
        await claims.delete(key)  # best effort: no error


async def test_expired_claim_is_missing(node: Node, connect: Connect) -> None:
    claims = Claims(await connect(node.url), "CLAIMS_ttl", ttl_s=1.0)
    key = await claims.put(b"short-lived")
    assert await claims.get(key) == b"short-lived"

    async def missing() -> bool:
        try:
            await claims.get(key)
        except ClaimMissing:
            return True
        return False

    await until(missing, 10, "the claim gone at its age limit (the server's expiry: no event to await)", every=0.1)


async def test_existing_stream_is_brought_to_the_claims_settings(node: Node, connect: Connect) -> None:
    wire = await connect(node.url)
    made = await api(wire, f"STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["old.>"], "storage": "file"})
    assert "error" not in made
    claims = Claims(wire, STREAM, ttl_s=60.0)
    key = await claims.put(b"payload")
    assert await claims.get(key) == b"payload"
    config = (await api(wire, f"STREAM.INFO.{STREAM}"))["config"]
    assert config["subjects"] == ["old.>", f"$CLAIMS.{STREAM}.>"]
    assert config["max_age"] == 60 * 10**9
    assert config["duplicate_window"] <= config["max_age"]


async def test_stream_deleted_under_it_is_made_again(node: Node, connect: Connect) -> None:
    wire = await connect(node.url)
    claims = Claims(wire, STREAM)
    await claims.get(await claims.put(b"first"))
    assert (await api(wire, f"STREAM.DELETE.{STREAM}"))["success"]
    key = await claims.put(b"second")  # its publish finds nobody listening: the stream is made again
    assert await claims.get(key) == b"second"


async def test_api_error_is_typed(node: Node, connect: Connect) -> None:
    claims = Claims(await connect(node.url), STREAM, replicas=3)  # a single server cannot
    with pytest.raises(JetStreamError) as caught:
        await claims.put(b"x")
    error = caught.value
    assert (error.code, error.err_code) == (500, 10074)
    assert "replicas" in error.description and "replicas" in str(error)


async def test_server_without_jetstream(nats_servers: NatsServers, connect: Connect) -> None:
    node = await nats_servers.start()
    claims = Claims(await connect(node.url), STREAM)
    async with asyncio.timeout(2):  # at once, not after the timeout
        with pytest.raises(JetStreamUnavailable, match="no JetStream"):
            await claims.put(b"x" * 10)
        with pytest.raises(ClaimError):
            await claims.get(f"{'a' * 32}.1.10")


async def test_silent_jetstream_times_out(nats_servers: NatsServers, connect: Connect) -> None:
    node = await nats_servers.start()
    wire = await connect(node.url)

    async def ignore(msg: Msg) -> None:
        pass

    await wire.subscribe("$JS.API.>", cb=ignore)  # something listens, nothing answers
    claims = Claims(wire, STREAM, timeout=0.5)
    async with asyncio.timeout(3):
        with pytest.raises(ClaimTimeout):
            await claims.put(b"x")


# a cluster ----------------------------------------------------------------------------------
async def lead(wire: Wire, stream: str, server: str) -> None:
    """Until ``server`` is ``stream``'s leader (asked for with a stepdown naming it)."""

    async def leads() -> bool:
        info = await api(wire, f"STREAM.INFO.{stream}")
        if info.get("cluster", {}).get("leader") == server:
            return True
        await api(wire, f"STREAM.LEADER.STEPDOWN.{stream}", {"placement": {"preferred": server}})
        return False

    await until(leads, 30, f"{server} leading {stream} (an election: no event to await)", every=0.2)


async def test_cluster_claim_outlives_its_node(nats_servers: NatsServers, tmp_path: Path, connect: Connect) -> None:
    nodes = [
        await nats_servers.start(jetstream(tmp_path, f"n{i}"), port=port, args=args)
        for i, (port, args) in enumerate(NatsServers.plan(3), start=1)
    ]
    wire = await connect(",".join(node.url for node in nodes), dont_randomize=True)
    assert wire.pool.current is not None and wire.pool.current.port == nodes[0].port
    claims = Claims(wire, STREAM, replicas=3, timeout=30)
    data = os.urandom(3 * claims.chunk_size + 5)
    key = await claims.put(data)  # the first use waits out the cluster's first elections
    info = await api(wire, f"STREAM.INFO.{STREAM}")
    assert info["config"]["num_replicas"] == 3 and len(info["cluster"]["replicas"]) == 2
    await lead(wire, STREAM, "n1")  # the hardest case: the dead node led the stream

    nodes[0].signal(signal.SIGKILL)
    await nodes[0].dead()
    assert await claims.get(key) == data  # through another node, after the stream's election
    assert wire.pool.current is not None and wire.pool.current.port in (nodes[1].port, nodes[2].port)
    await claims.delete(key)
    with pytest.raises(ClaimMissing):
        await claims.get(key)
