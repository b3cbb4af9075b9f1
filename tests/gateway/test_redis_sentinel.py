"""Responses storage through Redis Sentinel, over real processes started here (a primary, its
replicas and three sentinels on free loopback ports, in temporary directories):

- a save is acknowledged only once a replica has it (read from the replica itself);
- the primary killed (SIGKILL) under a loop of saves: no acknowledged save is lost, a save in
  flight succeeds late or raises the storage error (nothing else), and storage works again on
  its own well within 15 s of the death;
- a replica missing: a save is refused as storage unavailable, and works again once one follows;
- a configuration that cannot work is one clear line at start (no sentinel answers, none knows
  the service, a refused password), within seconds (the gateway's own start-up log included).

A write retried after its reply was lost: tests/gateway/test_redis_conn.py."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from services.common.infra import free_port
from services.common.metrics import REGISTRY
from services.common.redis_url import RedisConfigError, RedisOptions
from services.gateway.redis_conn import ReplicasBehind, StorageUnavailable
from services.gateway.responses.response import ResponseBody
from services.gateway.store import RedisResponseStore, StoredResponse
from tests.redis_topology import (
    SERVICE,
    Topology,
    answers,
    port_of,
    sentinel_ports,
    start_redis_node,
    start_sentinels,
    topology,
    wait_until,
)

OPTIONS = RedisOptions(min_replicas=1, wait_ms=500, failover_s=15)
WORKERS = 4  # tasks saving in a loop while the primary dies


def record(rid: str) -> StoredResponse:
    body = {"id": rid, "object": "response", "status": "completed", "background": False, "output": [{"text": rid}]}
    return StoredResponse(response=ResponseBody.model_validate(body))


async def on_replicas(ports: list[int], key: str) -> list[int]:
    """The replicas (of ``ports``) holding ``key``."""
    found = []
    for port in ports:
        client = aioredis.Redis(port=port)
        try:
            if await client.exists(key):
                found.append(port)
        finally:
            await client.aclose()
    return found


def counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("chorus_storage_retries_total", {"outcome": outcome}) or 0.0


@dataclass
class Saves:
    """A loop of saves from several tasks: what each returned, and when."""

    store: RedisResponseStore
    acked: list[tuple[str, float, float]] = field(default_factory=list)  # id, started, returned
    failed: list[tuple[str, float, float, BaseException]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    pending: dict[int, float] = field(default_factory=dict)  # worker -> when its unanswered save started

    async def loop(self, worker: int) -> None:
        for i in range(1_000_000):
            if self.stop.is_set():
                return
            rid = f"resp_{worker}_{i}"
            started = time.monotonic()
            self.pending[worker] = started
            try:
                await self.store.save_response(record(rid), [])
            except Exception as exc:  # noqa: BLE001 - every failure is recorded and checked
                self.failed.append((rid, started, time.monotonic(), exc))
            else:
                self.acked.append((rid, started, time.monotonic()))
            finally:
                del self.pending[worker]
            await asyncio.sleep(0.002)  # a client's pace; saves need not be back to back

    def sent_after(self, moment: float) -> list[tuple[str, float, float]]:
        """The saves acknowledged that were sent after ``moment``."""
        return [a for a in self.acked if a[1] > moment]


def stopped(pid: int) -> bool:
    """Is process ``pid`` stopped (SIGSTOP; Linux)?"""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        await asyncio.sleep(0.02)


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[Topology]:
    """A primary and two replicas: after a failover one replica follows the new primary, so
    writes that wait for one replica go on (with one replica they would wait for a new one)."""
    with topology(tmp_path, replicas=2) as topo:
        yield topo


async def test_the_primary_killed_under_saves_loses_no_acknowledged_save(two_replicas: Topology) -> None:
    topo = two_replicas
    store = RedisResponseStore.from_url(topo.url, namespace="sentinel", ttl_s=600, options=OPTIONS)
    try:
        for i in range(10):  # each acknowledged save is on a replica already
            await store.save_response(record(f"first_{i}"), [])
            assert await on_replicas(list(topo.replicas), f"sentinel:resp:first_{i}")
        failovers = counted("failover")

        saves = Saves(store)
        primary = topo.primary.proc
        assert primary is not None
        async with asyncio.TaskGroup() as tg:
            for worker in range(WORKERS):
                tg.create_task(saves.loop(worker))
            await until(lambda: len(saves.acked) >= 40, 20, "saves before the kill")
            # frozen first, so that every worker has a save sent and unanswered when it dies
            primary.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            await until(lambda: stopped(primary.pid), 5, "the primary stopped")  # it answers nothing more
            await until(lambda: len(saves.pending) == WORKERS, 5, "every worker waiting on the primary")
            killed = time.monotonic()
            primary.send_signal(signal.SIGKILL)
            # storage works again: a save sent after the death is acknowledged
            await until(lambda: len(saves.sent_after(killed)) >= 1, 20, "a save sent after the kill acknowledged")
            back = min(a[2] for a in saves.sent_after(killed)) - killed
            await until(lambda: len(saves.sent_after(killed + back)) >= 40, 20, "saves after the failover")
            saves.stop.set()

        assert back < 15, f"storage worked again {back:.1f}s after the primary's death"
        odd = [f for f in saves.failed if not isinstance(f[3], StorageUnavailable)]
        assert not odd, odd[:3]
        lost = [rid for rid, _, _ in saves.acked if await store.get_response(rid) is None]
        assert not lost, f"{len(lost)} acknowledged saves lost: {lost[:5]}"
        for i in range(10):
            assert await store.get_response(f"first_{i}") is not None
        assert counted("failover") > failovers  # the new primary was noticed
        cut = [a for a in saves.acked if a[1] < killed < a[2]]  # sent to the primary that died
        assert len(cut) + len([f for f in saves.failed if f[1] < killed]) == WORKERS
        late = [a for a in saves.acked if a[2] > killed and a[1] < killed + back]
        print(
            f"\nfailover: storage unavailable for {back:.2f}s after SIGKILL ({killed - frozen + back:.2f}s after "
            f"the primary stopped answering); {len(saves.acked)} saves acknowledged, {len(late)} of them waiting "
            f"through the failover ({len(cut)} sent to the primary that died), {len(saves.failed)} refused"
        )
    finally:
        await store.close()


@pytest.fixture
def one_replica(tmp_path: Path) -> Iterator[Topology]:
    with topology(tmp_path, replicas=1, others=0) as topo:
        yield topo


async def test_a_save_no_replica_acknowledges_is_refused(one_replica: Topology) -> None:
    topo = one_replica
    store = RedisResponseStore.from_url(topo.url, namespace="wait", ttl_s=600, options=OPTIONS)
    try:
        await store.save_response(record("kept"), [])
        assert await on_replicas(list(topo.replicas), "wait:resp:kept")
        for proc in topo.replicas.values():
            proc.stop()
        topo.replicas.clear()
        started = time.monotonic()
        with pytest.raises(ReplicasBehind, match="0 of the 1 replica"):
            await store.save_response(record("refused"), [])
        assert time.monotonic() - started < 3  # WAIT's timeout, not the failover window
        # a replica follows again: saves are acknowledged again, on it
        port = await asyncio.to_thread(topo.add_replica, topo.primary_port)
        await store.save_response(record("again"), [])
        assert await on_replicas([port], "wait:resp:again") == [port]
    finally:
        await store.close()


# -- a configuration that cannot work: one line at start, within seconds -----------------------------
@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A primary requiring a password, watched by one sentinel requiring its own."""
    logs = tmp_path_factory.mktemp("secured")
    primary, url = start_redis_node(password="primary-pw", log_path=logs / "primary.log")
    sentinels, sentinel_url = start_sentinels(
        port_of(url), 1, quorum=1, primary_password="primary-pw", password="sentinel-pw", log_dir=logs
    )
    client = redis.Redis(port=sentinel_ports(sentinel_url)[0], password="sentinel-pw")
    wait_until(answers(lambda: bool(client.sentinel_master(SERVICE))), 10, "the sentinel watching")
    client.close()
    yield sentinel_url.rsplit("/", 1)[0], port_of(url)
    for proc in [*sentinels, primary]:
        proc.stop()


def refused(url: str, options: RedisOptions, caplog: pytest.LogCaptureFixture) -> str:
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, "chorus.gateway.storage"), pytest.raises(RedisConfigError) as caught:
        RedisResponseStore.from_url(url, namespace="bad", ttl_s=60, options=options)
    assert time.monotonic() - started < 8, "the check is bounded"
    message = str(caught.value)
    assert "\n" not in message
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert lines == [message], lines  # the start-up log says it, in one line
    return message


def test_no_sentinel_answering(caplog: pytest.LogCaptureFixture) -> None:
    ports = [free_port() for _ in range(3)]
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in ports) + f"/{SERVICE}"
    message = refused(url, RedisOptions(), caplog)
    assert "none of the sentinels answers" in message
    assert all(f"127.0.0.1:{p}" in message for p in ports)


def test_a_service_no_sentinel_knows(secured: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    base, _ = secured
    message = refused(f"{base}/nosuch", RedisOptions(sentinel_password="sentinel-pw"), caplog)
    assert "no sentinel names a primary for the service 'nosuch'" in message
    assert f"they monitor: {SERVICE}" in message


@pytest.mark.parametrize(
    ("userinfo", "options", "says"),
    [
        (":wrong@", RedisOptions(sentinel_password="sentinel-pw"), "refused the password"),
        ("", RedisOptions(sentinel_password="sentinel-pw"), "needs a password"),
        (":primary-pw@", RedisOptions(sentinel_password="wrong"), "the sentinels refused this client"),
        (":primary-pw@", RedisOptions(), "the sentinels refused this client"),
    ],
)
def test_a_refused_password(
    secured: tuple[str, int], userinfo: str, options: RedisOptions, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = secured
    url = base.replace("://", f"://{userinfo}", 1) + f"/{SERVICE}"
    message = refused(url, options, caplog)
    assert says in message
    assert "primary-pw" not in message and "sentinel-pw" not in message


def test_a_plain_url_with_a_refused_password(secured: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    _, port = secured
    assert "refused the password" in refused(f"redis://:wrong@127.0.0.1:{port}/0", RedisOptions(), caplog)


async def test_the_right_passwords_work(secured: tuple[str, int]) -> None:
    base, _ = secured
    url = base.replace("://", "://:primary-pw@", 1) + f"/{SERVICE}"
    options = RedisOptions(sentinel_password="sentinel-pw", min_replicas=0)
    store = RedisResponseStore.from_url(url, namespace="secured", ttl_s=60, options=options)
    try:
        await store.save_response(record("secured"), [])
        assert await store.get_response("secured") is not None
    finally:
        await store.close()


def test_the_gateway_says_so_at_start(nats_url: str) -> None:
    """`chorus serve gateway` with sentinels that do not answer: one line saying which and what
    failed (no traceback), and it exits instead of hanging."""
    sentinels = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_") and k not in ("NATS_URL", "REDIS_URL")}
    env.update(
        CHORUS_NATS_URL=nats_url,
        CHORUS_REDIS_URL=f"redis+sentinel://{sentinels}/{SERVICE}",
        CHORUS_PORT=str(free_port()),
        CHORUS_NAMESPACE=f"sentinel-{free_port()}",
    )
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", "gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("chorus serve gateway: "), done.stderr[-2000:]
    assert "Traceback" not in done.stdout
    assert "Redis Sentinel: none of the sentinels answers" in said[0]
    assert all(f"{s} does not answer" in said[0] for s in sentinels.split(","))
