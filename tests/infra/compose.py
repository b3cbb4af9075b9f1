"""Reading docker-compose.yml the way `docker compose` does, for the infra tests: the YAML (merge
keys included), ``${NAME:-default}`` interpolation with an empty environment, and which services
run the Chorus image."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
INFRA = ROOT / "infra"

# `${NAME:-default}` (the only interpolation form the compose file uses) and its escape `$$`
VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):-(?P<default>[^}]*)\}")
ONE_VARIABLE = re.compile(rf"^{VARIABLE.pattern}$")

# the metrics the gateway serves at /metrics (aggregated across the stack)
METRICS = frozenset(
    {
        "chorus_requests_total",
        "chorus_request_duration_seconds",
        "chorus_time_to_first_token_seconds",
        "chorus_inter_token_latency_seconds",
        "chorus_prompt_tokens_total",
        "chorus_output_tokens_total",
        "chorus_reasoning_tokens_total",
        "chorus_requests_in_flight",
        "chorus_engine_up",
        "chorus_engine_in_flight",
        "chorus_parser_recoveries_total",
        "chorus_tool_calls_total",
        "chorus_bus_hop_seconds",
        "chorus_generation_resumes_total",
    }
)
HISTOGRAMS = frozenset(
    {
        "chorus_request_duration_seconds",
        "chorus_time_to_first_token_seconds",
        "chorus_inter_token_latency_seconds",
        "chorus_bus_hop_seconds",
    }
)


@cache
def spec() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = spec()["services"]
    return found


def chorus_services() -> dict[str, dict[str, Any]]:
    """The services built from infra/Dockerfile (one per `chorus serve NAME`)."""
    return {
        name: svc for name, svc in services().items() if svc.get("build", {}).get("dockerfile") == "infra/Dockerfile"
    }


def resolve(value: str, host_env: dict[str, str] | None = None) -> str:
    """``value`` as compose passes it when the host sets ``host_env`` (nothing by default)."""
    env = host_env or {}
    return VARIABLE.sub(lambda m: env.get(m["name"]) or m["default"], value).replace("$$", "$")


def environment(service: str) -> dict[str, str | None]:
    """A service's `environment` mapping, unresolved (None: passed through from the host)."""
    env = services()[service].get("environment", {})
    assert isinstance(env, dict), f"{service}: write environment as a mapping"
    return {k: None if v is None else str(v) for k, v in env.items()}


def resolved_environment(service: str) -> dict[str, str]:
    """The environment a container of ``service`` gets when no variable is set on the host."""
    return {k: resolve(v) for k, v in environment(service).items() if v is not None}


def command(service: str, host_env: dict[str, str] | None = None) -> list[str]:
    cmd = services()[service]["command"]
    assert isinstance(cmd, list), f"{service}: write the command as a list (no shell parsing)"
    return [resolve(str(part), host_env) for part in cmd]


def container_ports(service: str) -> list[int]:
    """The container side of every published port ("[HOST_IP:]HOST_PORT:CONTAINER_PORT")."""
    ports = []
    for entry in services()[service].get("ports", []):
        if isinstance(entry, dict):
            ports.append(int(entry["target"]))
        else:
            ports.append(int(resolve(str(entry)).split(":")[-1].split("/")[0]))
    return ports


def mount_source(service: str, target: str) -> Path:
    """The host path bind-mounted at ``target`` in ``service``."""
    for volume in services()[service].get("volumes", []):
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == target:
            assert source.startswith("./"), f"{service}: {target} is not a bind mount of the repo"
            return ROOT / source[2:]
    raise AssertionError(f"{service} mounts nothing at {target}")
