"""Redis Sentinel topologies for tests: a primary, its replicas and three sentinels, real
redis-server processes on free loopback ports in a temporary directory."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from services.common.infra import (
    ManagedProcess,
    free_port,
    redis_options,
    redis_server_binary,
    server_dir,
    wait_for_port,
)
from tests.waiting import wait_until as wait_until  # the sentinel tests import it from here

SERVICE = "mymaster"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def sentinel_ports(url: str) -> list[int]:
    hosts = url.split("://", 1)[1].split("/", 1)[0]
    return [int(h.rsplit(":", 1)[1]) for h in hosts.split(",")]


def answers(check: Callable[[], bool]) -> Callable[[], bool]:
    def condition() -> bool:
        try:
            return check()
        except redis.RedisError:
            return False

    return condition


@dataclass
class Topology:
    primary: ManagedProcess
    primary_port: int
    replicas: dict[int, ManagedProcess]
    sentinels: list[ManagedProcess]
    url: str
    logs: Path
    extra: list[ManagedProcess] = field(default_factory=list)

    def add_replica(self, of: int) -> int:
        proc, url = start_redis_node(replica_of=of, log_path=self.logs / "replica.log")
        port = port_of(url)
        self.replicas[port] = proc
        self.wait_synced(port)
        return port

    def wait_synced(self, port: int) -> None:
        client = redis.Redis(port=port)
        wait_until(
            answers(lambda: client.info("replication").get("master_link_status") == "up"), 20, "a replica in sync"
        )
        client.close()

    def wait_watched(self, replicas: int, others: int) -> None:
        """Every sentinel knows the primary's replicas and ``others`` other sentinels."""
        for port in sentinel_ports(self.url):
            client = redis.Redis(port=port)

            def ready(c: redis.Redis = client) -> bool:
                state: Any = c.sentinel_master(SERVICE)
                return bool(state["num-slaves"] >= replicas and state["num-other-sentinels"] >= others)

            wait_until(answers(ready), 30, "the sentinels watching the primary and its replicas")
            client.close()

    def stop(self) -> None:
        for proc in [*self.sentinels, *self.replicas.values(), self.primary, *self.extra]:
            proc.stop()


@contextlib.contextmanager
def topology(tmp_path: Path, replicas: int, *, others: int = 2) -> Iterator[Topology]:
    primary, url = start_redis_node(log_path=tmp_path / "primary.log")
    primary_port = port_of(url)
    sentinels, sentinel_url = start_sentinels(primary_port, log_dir=tmp_path)
    topo = Topology(primary, primary_port, {}, sentinels, sentinel_url, tmp_path)
    try:
        for _ in range(replicas):
            topo.add_replica(primary_port)
        topo.wait_watched(replicas, others)
        yield topo
    finally:
        topo.stop()


def write_owner_only(path: Path, text: str) -> None:
    """``text`` in a file only its owner reads (a config file holding passwords)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)


def start_redis_node(
    port: int | None = None,
    log_path: Path | None = None,
    *,
    replica_of: int | None = None,
    password: str | None = None,
    data_dir: Path | None = None,
) -> tuple[ManagedProcess, str]:
    """redis-server as ``start_redis`` starts it, optionally a replica of the server on
    ``replica_of`` (``--replicaof``, loopback) and requiring ``password`` (also the one it gives
    its primary): a primary and replicas for Sentinel (``start_sentinels``)."""
    port = port or free_port()
    proc = ManagedProcess("redis-server" if replica_of is None else "redis-replica", [])
    workdir = server_dir(data_dir, f"redis-{port}", proc)
    conf = Path(workdir) / "node.conf"
    secrets = f"requirepass {json.dumps(password)}\nmasterauth {json.dumps(password)}\n" if password else ""
    write_owner_only(conf, secrets)
    proc.args = [redis_server_binary(), str(conf), *redis_options(port, workdir)]
    if replica_of is not None:
        proc.args += ["--replicaof", "127.0.0.1", str(replica_of)]
    proc.start(log_path)
    wait_for_port("127.0.0.1", port, proc)
    return proc, f"redis://127.0.0.1:{port}/0"


def start_sentinels(
    primary_port: int,
    count: int = 3,
    *,
    service: str = "mymaster",
    quorum: int = 2,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 3000,
    primary_password: str | None = None,
    password: str | None = None,
    log_dir: Path | None = None,
) -> tuple[list[ManagedProcess], str]:
    """``count`` sentinels (redis-server ``--sentinel``) on loopback monitoring the primary on
    ``primary_port`` as ``service``: it counts as down after ``down_after_ms`` unanswered and
    ``quorum`` of them agreeing; ``primary_password`` is the primary's, ``password`` the one the
    sentinels themselves require. Returns them and their ``redis+sentinel://`` URL."""
    procs: list[ManagedProcess] = []
    addresses: list[str] = []
    for _ in range(count):
        port = free_port()
        proc = ManagedProcess("redis-sentinel", [])
        workdir = server_dir(None, "sentinel", proc)
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {workdir}",
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} {failover_timeout_ms}",
            f"sentinel parallel-syncs {service} 1",
        ]
        if primary_password:
            lines.append(f"sentinel auth-pass {service} {json.dumps(primary_password)}")
        if password:
            lines.append(f"requirepass {json.dumps(password)}")
        conf = Path(workdir) / "sentinel.conf"  # the sentinel rewrites it as its view changes
        write_owner_only(conf, "\n".join(lines) + "\n")
        proc.args = [redis_server_binary(), str(conf), "--sentinel"]
        try:
            proc.start(log_dir / f"sentinel-{port}.log" if log_dir else None)
            wait_for_port("127.0.0.1", port, proc)
        except BaseException:
            for started in [*procs, proc]:
                started.stop()
            raise
        procs.append(proc)
        addresses.append(f"127.0.0.1:{port}")
    return procs, f"redis+sentinel://{','.join(addresses)}/{service}"
