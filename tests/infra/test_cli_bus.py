"""`chorus` against NATS and engines that are not there or not ready, as a user meets them:
an unreachable engine reported in seconds (and its return), servers of its own on free ports,
`serve` and `ping` giving up on an unreachable NATS with one line and obeying SIGTERM while
trying, `ping` finding a running stack without flags, render processes dying with their encoder,
JSON logs from the environment, `--version` and every `--help`."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest

from services.common.infra import ensure_nats, ensure_redis, free_port, port_open
from tests.infra.cli_process import FAIL_FAST_S, READY_WITHIN_S, ROOT, STOP_WITHIN_S, Chorus, _env, _running, up
from tests.waiting import wait_until


async def _refuses_strangers(url: str) -> bool:
    try:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0)
    except Exception:  # noqa: BLE001 - refused (authorization violation): what the test wants
        return True
    await nc.close()
    return False


def test_an_unreachable_engine_is_reported_in_seconds_and_its_return_too(tmp_path: Path) -> None:
    """An engine nobody answers at is NOT READY as soon as the rest is up (the dispatcher gives
    a starting engine a few seconds), not after --startup-timeout; `ready` follows when it
    answers. This stack runs its own NATS and Redis (asked for at free ports), stopped last."""
    engine_port = free_port()
    nats, redis = f"nats://127.0.0.1:{free_port()}", f"redis://127.0.0.1:{free_port()}/0"
    stack = up(
        "--engine",
        f"vllm=http://127.0.0.1:{engine_port}",
        "--nats-url",
        nats,
        "--redis-url",
        redis,
        "--startup-timeout",
        "300",
        log_dir=tmp_path,
    )
    sim = None
    try:
        assert f"started nats-server (JetStream) at {nats}" in stack.wait_line("started nats-server", 30)
        assert asyncio.run(_refuses_strangers(nats))  # the stack's own NATS wants its password
        started = time.monotonic()
        line = stack.wait_line("NOT READY", READY_WITHIN_S)
        reported_after = time.monotonic() - started
        print(f"NOT READY {reported_after:.1f}s after NATS was up: {line.strip()}")
        assert f"http://127.0.0.1:{engine_port} is down" in line, line
        assert reported_after < 60, f"{reported_after:.1f}s"
        sim = Chorus.start(
            "serve", "sim-engine", env=_env(CHORUS_SIM_HOST="127.0.0.1", CHORUS_SIM_PORT=str(engine_port))
        )
        stack.wait_line("chorus: ready at ", 30)
        _pings_without_flags(stack, nats)
        took = stack.stop(signal.SIGTERM)
        print(f"engine up: ready; stopped (own NATS and Redis too) in {took:.2f}s")
        assert took < STOP_WITHIN_S, f"{took:.2f}s"
        assert not port_open("127.0.0.1", int(nats.rsplit(":", 1)[1]))  # its NATS stopped too
        everything = stack.output + stack.logs()
        assert "Traceback" not in everything and "lost the NATS connection" not in everything, everything
    finally:
        stack.kill()
        if sim is not None:
            sim.kill()


def _ping(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "ping", *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
        env=_env(),
        check=False,
    )


def _pings_without_flags(stack: Chorus, nats: str) -> None:
    """`chorus ping` finds a running `chorus up` of its namespace (and the password of the
    NATS it started); the worker, the default shape, answers; a client without the password
    is told it was refused, not that NATS is unreachable."""
    namespace = f"chorus-{stack.port}"
    for service in ("worker", "encoder"):
        done = _ping(service, "--namespace", namespace)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(f"{service} ") and ": ready" in done.stdout, done.stdout
    refused = _ping("encoder", "--namespace", "no-such-stack", "--nats-url", nats)
    assert refused.returncode == 1
    assert "refused this client's credentials" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_stack_starts_servers_of_its_own_on_free_ports() -> None:
    """Nothing at the default address: the servers started are the stack's own, on free ports
    (another stack would never find and share them); an address asked for is used as given."""
    closed = free_port()
    started = []
    try:
        for ensure, scheme in ((ensure_nats, "nats"), (ensure_redis, "redis")):
            first, url_1 = ensure(f"{scheme}://127.0.0.1:{closed}", at_url=False)
            second, url_2 = ensure(f"{scheme}://127.0.0.1:{closed}", at_url=False)
            started += [first, second]
            assert first is not None and second is not None
            assert len({url_1, url_2}) == 2 and f":{closed}" not in url_1 + url_2
            asked, url_3 = ensure(f"{scheme}://127.0.0.1:{closed}")
            started.append(asked)
            assert asked is not None and f":{closed}" in url_3
            asked.stop()
    finally:
        for proc in started:
            if proc is not None:
                proc.stop()


@pytest.mark.parametrize("command", [["ping", "encoder"], ["serve", "encoder"], ["serve", "gateway"]], ids=" ".join)
def test_an_unreachable_nats_fails_in_seconds_with_one_line(command: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", *command],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
        env=_env(CHORUS_NATS_URL=url),
        check=False,
    )
    took = time.monotonic() - started
    lines = (run.stdout + run.stderr).strip().splitlines()
    print(f"exit {run.returncode} in {took:.1f}s: {lines}")
    assert run.returncode != 0
    assert took < FAIL_FAST_S, f"{took:.1f}s"
    assert len(lines) == 1 and f"cannot reach NATS at {url}" in lines[0], lines


@pytest.mark.parametrize(
    "command",
    [["serve", "gateway", "--connect-timeout", "60"], ["ping", "dispatcher", "--timeout", "60"]],
    ids=lambda c: c[0],
)
def test_sigterm_is_obeyed_while_waiting_for_nats(command: list[str]) -> None:
    """A NATS that accepts the connection but never speaks: the command keeps trying until
    SIGTERM, then exits at once."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(60)
        url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
        chorus = Chorus.start(*command, env=_env(CHORUS_NATS_URL=url))
        try:
            conn, _ = silent.accept()  # it is trying
            conn.close()
            took = chorus.stop(signal.SIGTERM)
        finally:
            chorus.kill()
    print(f"SIGTERM while trying: exit {chorus.proc.returncode} in {took:.2f}s")
    assert chorus.proc.returncode != 0
    assert took < 2.0, f"{took:.2f}s"
    assert "Traceback" not in chorus.output, chorus.output


def test_an_encoder_killed_outright_takes_its_render_processes_along(nats_url: str) -> None:
    """Every process `chorus up` starts dies with its parent (PR_SET_PDEATHSIG), the encoder's
    render pool (forked, not exec'd: its inherited SIGTERM handler is reset) included."""
    encoder = Chorus.start(
        "serve", "encoder", env=_env(CHORUS_NATS_URL=nats_url, CHORUS_NAMESPACE=f"cli{uuid.uuid4().hex[:8]}")
    )
    try:
        encoder.wait_line("encoder .*: serving", 60)
        workers = encoder.children()
        assert workers, "the encoder has a render process"
        encoder.proc.kill()
        encoder.finish(10)
        # the kernel's SIGTERM to an orphan: nothing to wait on but its pid
        wait_until(lambda: not any(_running(pid) for pid in workers), 10, "the render processes gone with the encoder")
    finally:
        encoder.kill()


def test_log_format_json_from_the_environment() -> None:
    sim = Chorus.start(
        "serve",
        "sim-engine",
        env=_env(CHORUS_LOG_FORMAT="json", CHORUS_SIM_HOST="127.0.0.1", CHORUS_SIM_PORT=str(free_port())),
    )
    try:
        line = sim.wait_line("SIMULATED", 30)
    finally:
        sim.kill()
    record = json.loads(line)
    assert record["level"] == "WARNING" and record["logger"] == "chorus.simengine", record
    assert "SIMULATED gpt-oss engine" in record["message"] and record["time"].endswith("+00:00")


def test_version_and_every_help_shows_defaults() -> None:
    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", *args],
            cwd=ROOT,
            text=True,
            capture_output=True,
            timeout=60,
            env=_env(),
            check=True,
        )
        return done.stdout

    assert run("--version").strip() == f"chorus {importlib.metadata.version('chorus')}"
    helps = {
        command: " ".join(run(*command.split(), "--help").split())
        for command in ("up", "serve gateway", "ping encoder", "ping worker")
    }
    for want in (
        "--port PORT the gateway's port (default: 8000)",
        "(default: 127.0.0.1)",
        "(default: 60.0)",
        "(default: text)",
        "parser processes (default: 2)",
    ):
        assert want in helps["up"], want
    assert "for NATS before giving up (default: 4.0)" in helps["serve gateway"]
    assert "wait for an answer (default: 3.0)" in helps["ping encoder"]
