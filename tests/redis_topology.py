"""Redis Sentinel topologies for tests: a primary, its replicas and three sentinels, real
redis-server processes on free loopback ports in a temporary directory."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from services.common.infra import ManagedProcess, start_redis_node, start_sentinels
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
