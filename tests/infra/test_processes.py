"""The compose services' commands, run here as processes: nats-server with infra/nats.conf and
the compose flags (authentication, JetStream), redis-server with the compose flags (append-only,
noeviction), and Chorus services with their compose environment and healthcheck, replica by
replica. Docker is not needed: only the container paths and ports are swapped for local ones."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import redis

from contracts.subjects import Subjects
from services.common.infra import free_port, nats_server_binary, port_open, redis_server_binary
from tests.infra.compose import INFRA, command, resolved_environment, services
from tests.waiting import wait_until

PASSWORD = "s3cret with spaces, 'quotes' and {braces}"  # taken literally by the compose flags
# the services' NATS: credentials in the environment (CHORUS_NATS_USER / CHORUS_NATS_PASSWORD)
# and, for clients that read only the URL, in CHORUS_NATS_URL too
BUS_PASSWORD = "infra-test-password"
STARTS_WITHIN_S = 45.0  # a Chorus service's start-up on a busy 2-core machine, with margin
HEALTHY_AFTER_BEAT_S = 3.0  # from its first heartbeat on the bus to a passing healthcheck


async def _quiet(_: Exception) -> None:
    pass


def _wait(condition: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``condition()``; failing at once when ``proc`` exits meanwhile."""

    def holds() -> bool:
        if condition():
            return True
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode}")
        return False

    wait_until(holds, timeout, what, every=0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _nats(tmp: Path, password: str) -> Iterator[tuple[int, int]]:
    """nats-server as compose runs it (the password set on the host): (client port, monitor port)."""
    conf = tmp / "nats.conf"
    conf.write_text((INFRA / "nats.conf").read_text().replace("/data", str(tmp / "data")))
    args = command("nats-1", {"CHORUS_NATS_PASSWORD": password})
    args[args.index("--config") + 1] = str(conf)  # the node's settings, without the cluster: one node
    for flag in ("--cluster", "--routes"):
        del args[args.index(flag) : args.index(flag) + 2]
    port, monitor = free_port(), free_port()
    proc = subprocess.Popen(
        [nats_server_binary(), *args, "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: port_open("127.0.0.1", port), 15, "nats-server listens", proc)
        yield port, monitor
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    yield from _nats(tmp_path_factory.mktemp("nats"), PASSWORD)


@pytest.fixture(scope="module")
def bus_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    for port, _monitor in _nats(tmp_path_factory.mktemp("bus"), BUS_PASSWORD):
        yield port


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """redis-server with the compose command's flags (its data directory and port local)."""
    tmp = tmp_path_factory.mktemp("redis")
    port = free_port()
    args = command("redis")[1:]
    proc = subprocess.Popen(
        [redis_server_binary(), *args, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: port_open("127.0.0.1", port), 15, "redis-server listens", proc)
        yield port
    finally:
        _stop(proc)


def test_nats_answers_its_healthcheck(nats_server: tuple[int, int]) -> None:
    assert services()["nats-1"]["healthcheck"]["test"][-1] == "http://127.0.0.1:8222/healthz"
    with urllib.request.urlopen(f"http://127.0.0.1:{nats_server[1]}/healthz", timeout=5) as resp:
        assert resp.status == 200  # server and JetStream up


async def test_nats_wants_the_credentials_and_serves_jetstream(nats_server: tuple[int, int]) -> None:
    url = f"nats://127.0.0.1:{nats_server[0]}"
    with pytest.raises(nats.errors.Error, match="Authorization"):
        await nats.connect(url, allow_reconnect=False, connect_timeout=3, error_cb=_quiet)
    with pytest.raises(nats.errors.Error, match="Authorization"):
        await nats.connect(
            url, user="chorus", password="chorus", allow_reconnect=False, connect_timeout=3, error_cb=_quiet
        )
    nc = await nats.connect(
        url, user="chorus", password=PASSWORD, allow_reconnect=False, connect_timeout=3, error_cb=_quiet
    )
    try:
        assert nc.max_payload == 8 * 1024 * 1024
        store = await nc.jetstream().create_object_store(f"infra-{uuid.uuid4().hex[:8]}")
        await store.put("prompt", b"x" * 2_000_000)
        assert len((await store.get("prompt")).data or b"") == 2_000_000
    finally:
        await nc.close()


def test_redis_persists_appends_and_refuses_writes_when_full(redis_port: int) -> None:
    client = redis.Redis(port=redis_port)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        maxmemory = client.config_get("maxmemory")["maxmemory"]
        assert maxmemory is not None and int(maxmemory) == 1024**3
        client.set("chorus:response:kept", "state a client refers to")
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 64 * 1024))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(1000):
                client.set(f"chorus:filler:{i}", "x" * 4096)
        assert client.get("chorus:response:kept") == b"state a client refers to"  # nothing evicted
    finally:
        client.close()


def _chorus() -> list[str]:
    exe = shutil.which("chorus")
    return [exe] if exe else [sys.executable, "-m", "services.cli"]


def _service_env(name: str, tmp: Path, nats_port: int, **overrides: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CHORUS_", "OTEL_")) and k not in ("NATS_URL", "REDIS_URL")
    }
    env = {**base, **resolved_environment(name)}
    if "CHORUS_NATS_URL" in env:
        env.update(
            {
                "CHORUS_NATS_PASSWORD": BUS_PASSWORD,  # as compose passes it when the host sets it
                "CHORUS_NATS_URL": f"nats://{env['CHORUS_NATS_USER']}:{BUS_PASSWORD}@127.0.0.1:{nats_port}",
            }
        )
    env.update(
        {
            "CHORUS_LIVENESS_FILE": str(tmp / f"{name}-{uuid.uuid4().hex[:6]}-alive"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",  # no Jaeger here
            **overrides,
        }
    )
    return env


def _healthcheck(name: str, env: dict[str, str], port: int | None = None) -> list[str]:
    test = services()[name]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "chorus-healthcheck"]
    args = list(test[2:])
    if "--http" in args and port is not None:
        i = args.index("--http") + 1
        args[i] = f"{port}/{args[i].partition('/')[2]}"
    return ["bash", str(INFRA / "healthcheck.sh"), *args]


def _healthy(check: list[str], env: dict[str, str]) -> bool:
    return subprocess.run(check, env=env, capture_output=True, timeout=10, check=False).returncode == 0


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        _stop(proc)


def _start(name: str, env: dict[str, str], tmp: Path, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen([*_chorus(), *command(name)], env=env, stdout=log, stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


async def _first_beat(bus_port: int, namespace: str, service: str, proc: subprocess.Popen[bytes]) -> None:
    """Until an instance of ``service`` beats on the bus: it is up and connected."""
    nc = await nats.connect(
        f"nats://127.0.0.1:{bus_port}",
        user="chorus",
        password=BUS_PASSWORD,
        allow_reconnect=False,
        connect_timeout=3,
        error_cb=_quiet,
    )
    try:
        sub = await nc.subscribe(Subjects(namespace).heartbeat(service))
        deadline = time.monotonic() + STARTS_WITHIN_S
        while True:
            assert proc.poll() is None, f"{service} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{service}: no heartbeat within {STARTS_WITHIN_S:g}s"
            try:
                await sub.next_msg(timeout=0.5)
                return
            except nats.errors.TimeoutError:
                continue
    finally:
        await nc.close()


async def test_each_worker_replica_has_its_own_health(
    bus_port: int, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    namespace = f"infra{uuid.uuid4().hex[:8]}"
    envs = [_service_env("worker", tmp_path, bus_port, CHORUS_NAMESPACE=namespace) for _ in range(2)]
    procs = [_start("worker", env, tmp_path, started) for env in envs]
    checks = [_healthcheck("worker", env) for env in envs]
    for proc, check, env in zip(procs, checks, envs, strict=True):
        await _first_beat(bus_port, namespace, "parser", proc)
        _wait(lambda c=check, e=env: _healthy(c, e), HEALTHY_AFTER_BEAT_S, "worker replica healthy", proc)
    _stop(procs[0])
    assert not _healthy(checks[0], envs[0]), "a stopped replica is unhealthy"
    assert _healthy(checks[1], envs[1]), "the other replica stays healthy"


async def test_the_dispatcher_is_healthy_without_an_engine(
    bus_port: int, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    namespace = f"infra{uuid.uuid4().hex[:8]}"
    env = _service_env(
        "worker", tmp_path, bus_port, CHORUS_NAMESPACE=namespace, CHORUS_ENGINES=f"sim=http://127.0.0.1:{free_port()}"
    )  # nothing listens there
    proc = _start("worker", env, tmp_path, started)
    await _first_beat(bus_port, namespace, "dispatcher", proc)
    _wait(
        lambda: _healthy(_healthcheck("worker", env), env),
        HEALTHY_AFTER_BEAT_S,
        "dispatcher healthy with its engine down",
        proc,
    )


async def test_the_gateway_is_healthy_when_connected_and_serving(
    bus_port: int, redis_port: int, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    namespace = f"infra{uuid.uuid4().hex[:8]}"
    env = _service_env(
        "gateway",
        tmp_path,
        bus_port,
        CHORUS_HOST="127.0.0.1",
        CHORUS_PORT=str(port),
        CHORUS_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        CHORUS_NAMESPACE=namespace,
    )
    proc = _start("gateway", env, tmp_path, started)
    check = _healthcheck("gateway", env, port)
    await _first_beat(bus_port, namespace, "gateway", proc)
    _wait(lambda: _healthy(check, env), STARTS_WITHIN_S, "gateway healthy", proc)
    _stop(proc)
    assert not _healthy(check, env)


def test_the_simulated_engine_is_healthy_when_it_answers(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    env = {**_service_env("sim-engine", tmp_path, 0), "CHORUS_SIM_HOST": "127.0.0.1", "CHORUS_SIM_PORT": str(port)}
    proc = _start("sim-engine", env, tmp_path, started)
    check = _healthcheck("sim-engine", env, port)
    assert "--no-liveness" in check
    _wait(lambda: _healthy(check, env), STARTS_WITHIN_S, "sim-engine healthy", proc)
