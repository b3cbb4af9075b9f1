"""Every setting of a composed service comes from the environment, with the services' own
defaults: engines, models and NATS credentials from the host (client and server reading the same
variable with the same default), each setting under its own variable or the service's
prefixed one, one default per host variable, and the defaults compose gives equal to the
services' own but where the file says why not."""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

import pytest

from services.cli import SERVICE_MODULES
from tests.infra.compose import COMPOSE, ONE_VARIABLE, environment, resolved_environment, services
from tests.infra.compose_roles import BUS_SERVICES, COMPOSED, NATS_NODES, clean_env

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
    for key in set(os.environ) - set(clean_env()):
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
