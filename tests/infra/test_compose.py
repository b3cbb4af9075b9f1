"""docker-compose.yml stays valid without Docker: the compose-spec JSON schema (vendored by
check-jsonschema), Debian's `docker-compose config -q` when installed, and the services it
names are the ones the CLI can serve."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from services.cli import SERVICE_MODULES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def test_compose_matches_the_compose_spec_schema() -> None:
    result = subprocess.run(
        ["check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_config_when_available() -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        return  # the JSON-schema check above still ran
    result = subprocess.run([exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                            check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_compose_runs_every_service_with_healthchecks() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {"nats", "redis", "jaeger"} <= services.keys()
    for name in ("encoder", "dispatcher", "parser", "tools", "gateway", "sim-engine"):
        svc = services[name]
        assert svc["command"][0] == "serve" and svc["command"][1] in SERVICE_MODULES
        assert "healthcheck" in svc, name
    assert services["parser"]["deploy"]["replicas"] == 2
    assert "-js" in Path(ROOT / "infra" / "nats.conf").read_text() or "jetstream" in (ROOT / "infra" / "nats.conf").read_text()
    assert (ROOT / "infra" / "Dockerfile").is_file()
