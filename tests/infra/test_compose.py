"""docker-compose.yml stays a valid, deployable stack without Docker: the compose-spec JSON schema
(vendored by check-jsonschema), Debian's `docker-compose config` when installed, and the rules
of the deployment: `chorus serve` commands, cheap healthchecks, dependencies on health, what is
published, scalable workers, draining before a stop. Where each setting comes from is in
test_compose_settings.py; the NATS cluster and Redis with its sentinels in
test_compose_cluster.py."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from services.cli import SERVICE_MODULES
from tests.infra.compose import (
    COMPOSE,
    ONE_VARIABLE,
    ROOT,
    chorus_services,
    command,
    container_ports,
    resolved_environment,
    services,
)
from tests.infra.compose_roles import (
    BUS_SERVICES,
    COMPOSED,
    INFRA_SERVICES,
    NATS_NODES,
    REDIS_NODES,
    SENTINELS,
    clean_env,
)


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
        env={**clean_env(), **(env or {})},
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
