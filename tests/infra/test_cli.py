"""`chorus` as a user runs it, as real processes (`python -m services.cli ...`) on this machine's
NATS and Redis: two stacks side by side answer only their own requests; a busy port or a
namespace another stack uses is refused at once with the flag to change; Ctrl-C and SIGTERM
stop a whole stack in under 3 s without a traceback; an unreachable engine is reported in
seconds (and a starting one is no alarm); `serve` and `ping` give up on an unreachable NATS
with one line and obey SIGTERM while trying; `--version`, `--help` defaults and JSON logs."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import openai
import pytest

from services.common.infra import ensure_nats, ensure_redis, free_port, port_open

ROOT = Path(__file__).resolve().parents[2]
MODEL = "openai/gpt-oss-20b"
STOP_WITHIN_S = 3.0  # Ctrl-C / SIGTERM to `chorus up` until every process it started is gone
# a refusal or a give-up: the interpreter's start-up on a busy 2-core machine, plus the check
FAIL_FAST_S = 10.0
READY_WITHIN_S = 90.0  # a whole stack's start-up on a busy 2-core machine, with margin


def _env(**extra: str) -> dict[str, str]:
    """This environment without Chorus settings (each test says what it means)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_") and k not in ("NATS_URL", "REDIS_URL")}
    return {**base, **extra}


@dataclass
class Chorus:
    """One `python -m services.cli ...` process and the lines it printed (stdout and stderr)."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    done: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)
    log_dir: Path | None = None
    port: int = 0

    @classmethod
    def start(cls, *args: str, env: dict[str, str] | None = None) -> Chorus:
        return cls.launch([sys.executable, "-m", "services.cli", *args], env=env)

    @classmethod
    def launch(cls, argv: list[str], env: dict[str, str] | None = None) -> Chorus:
        """``argv`` (a `chorus` command, however installed), its output read as it comes."""
        proc = subprocess.Popen(
            argv, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or _env()
        )
        chorus = cls(proc)
        threading.Thread(target=chorus._read, daemon=True).start()
        return chorus

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.done = True
            self.changed.notify_all()

    @property
    def output(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def wait_line(self, pattern: str, timeout: float) -> str:
        """The first line matching ``pattern``, once printed (fails if the process ends first)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((line for line in self.lines if re.search(pattern, line)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self.done or left <= 0:
                    raise AssertionError(
                        f"no line matching {pattern!r} within {timeout:g}s "
                        f"(exit {self.proc.poll()}):\n{''.join(self.lines)}{self.logs()}"
                    )
                self.changed.wait(left)

    def finish(self, timeout: float) -> float:
        """Seconds until the process has exited and its output is read."""
        started = time.monotonic()
        self.proc.wait(timeout)
        with self.changed:
            self.changed.wait_for(lambda: self.done, timeout)
        return time.monotonic() - started

    def stop(self, sig: int) -> float:
        """Send ``sig``; seconds until the process and everything it started are gone."""
        children = self.children()
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        elapsed = time.monotonic() - started
        left = [pid for pid in children if _running(pid)]
        assert not left, f"still running after chorus exited: {left}"
        self.finish(5)
        return elapsed

    def children(self) -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _parent(int(entry.name)) == self.proc.pid:
                pids.append(int(entry.name))
        return pids

    def logs(self) -> str:
        if self.log_dir is None:
            return ""
        return "".join(
            f"\n--- {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in sorted(self.log_dir.glob("*.log"))
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _stat(pid: int) -> list[str]:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    stat = _stat(pid)
    return int(stat[1]) if stat else 0


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return bool(stat) and stat[0] != "Z"


def up(*args: str, port: int | None = None, log_dir: Path | None = None) -> Chorus:
    port = port or free_port()
    extra = ["--log-dir", str(log_dir)] if log_dir else []
    chorus = Chorus.start("up", "--port", str(port), "--workers", "1", *extra, *args)
    chorus.log_dir, chorus.port = log_dir, port
    return chorus


def engine_url(chorus: Chorus) -> str:
    line = chorus.wait_line(r"SIMULATED engine at http://", 30)
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    assert match, line
    return match.group(1)


def chat(port: int, text: str) -> str:
    """One chat completion; its id (which the engine sees as its request id)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="chorus", max_retries=0, timeout=30)
    return client.chat.completions.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": text}]).id


def engine_saw(url: str) -> list[str]:
    return [str(r.get("request_id")) for r in httpx.get(f"{url}/sim/requests", timeout=5).json()]


@dataclass
class Pair:
    a: Chorus  # namespace derived from its port, JSON logs, --quiet
    b: Chorus  # a namespace given with --namespace, text logs
    namespace_b: str
    bus: list[str]


@pytest.fixture(scope="module")
def pair(nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two whole stacks at once on one NATS and one Redis, each with the simulated engine."""
    tmp_path = tmp_path_factory.mktemp("pair")
    bus = ["--nats-url", nats_url, "--redis-url", redis_url]
    namespace_b = f"cli{uuid.uuid4().hex[:8]}"
    a = up(*bus, "--log-format", "json", "--quiet", log_dir=tmp_path / "a")
    b = up(*bus, "--namespace", namespace_b, log_dir=tmp_path / "b")
    try:
        for stack in (a, b):
            stack.wait_line(r"chorus: ready at ", READY_WITHIN_S)
        yield Pair(a, b, namespace_b, bus)
    finally:
        a.kill()
        b.kill()


def _alive(pair: Pair) -> None:
    assert pair.a.proc.poll() is None and pair.b.proc.poll() is None, "the stacks were stopped"


def test_two_stacks_answer_only_their_own_requests(pair: Pair) -> None:
    _alive(pair)
    assert f"namespace chorus-{pair.a.port}" in pair.a.wait_line("chorus: ready", 1)
    assert f"namespace {pair.namespace_b}" in pair.b.wait_line("chorus: ready", 1)
    engine_a, engine_b = engine_url(pair.a), engine_url(pair.b)
    ids_a = [chat(pair.a.port, f"to stack a {i}") for i in range(3)]
    ids_b = [chat(pair.b.port, f"to stack b {i}") for i in range(3)]
    saw_a, saw_b = engine_saw(engine_a), engine_saw(engine_b)
    assert set(ids_a) <= set(saw_a) and not set(ids_b) & set(saw_a), (ids_a, ids_b, saw_a)
    assert set(ids_b) <= set(saw_b) and not set(ids_a) & set(saw_b), (ids_a, ids_b, saw_b)


def test_a_busy_port_is_refused_at_once(pair: Pair) -> None:
    _alive(pair)
    second = up(*pair.bus, port=pair.a.port)
    took = second.finish(FAIL_FAST_S + 20)
    print(f"exit {second.proc.returncode} in {took:.1f}s: {second.output.strip()}")
    assert second.proc.returncode != 0
    assert took < FAIL_FAST_S, f"{took:.1f}s"
    assert f"port {pair.a.port} " in second.output and "--port" in second.output, second.output
    assert "ready" not in second.output and "Traceback" not in second.output, second.output


def test_a_namespace_in_use_on_the_same_nats_is_refused(pair: Pair) -> None:
    _alive(pair)
    second = up(*pair.bus, "--namespace", pair.namespace_b)
    took = second.finish(FAIL_FAST_S + 20)
    print(f"exit {second.proc.returncode} in {took:.1f}s: {second.output.strip()}")
    assert second.proc.returncode != 0
    assert took < FAIL_FAST_S, f"{took:.1f}s"
    assert f"namespace {pair.namespace_b!r}" in second.output and "--namespace" in second.output, second.output
    assert len(second.output.strip().splitlines()) == 1, second.output
    assert "Traceback" not in second.output


def test_json_logs_from_every_service(pair: Pair) -> None:
    """`--log-format json`: every line of every service's log is one JSON object with time,
    level, logger and message; the gateway's access line carries the request id."""
    _alive(pair)
    with httpx.Client(base_url=f"http://127.0.0.1:{pair.a.port}", timeout=30) as http:
        resp = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "json logs"}]},
        )
    assert resp.status_code == 200
    request_id = resp.headers["x-request-id"]
    assert pair.a.log_dir is not None
    gateway_log = pair.a.log_dir / "gateway.log"
    deadline = time.monotonic() + 10
    while request_id not in gateway_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # the access line is written once the response is sent
    logs = {f.stem: f.read_text() for f in pair.a.log_dir.glob("*.log")}
    assert {"gateway", "worker-1", "tools", "sim-engine"} <= set(logs)
    for name, text in logs.items():
        for line in text.splitlines():
            record = json.loads(line)
            assert {"time", "level", "logger", "message"} <= set(record), (name, line)
    access = [json.loads(line) for line in logs["gateway"].splitlines() if request_id in line]
    assert access and access[0]["request_id"] == request_id, logs["gateway"]
    assert access[0]["logger"] == "chorus.gateway.access" and access[0]["request"]["status"] == 200


def test_the_terminal_shows_access_lines_and_which_servers_are_used(pair: Pair) -> None:
    """Without --log-dir a person still sees each request (the gateway's access line, prefixed
    by the service as compose does), WebSocket responses too; --quiet shows none. Both say which
    NATS and Redis they use and that they did not start them."""
    _alive(pair)
    ids = {stack.port: chat(stack.port, "access line please") for stack in (pair.a, pair.b)}
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{pair.b.port}/v1", api_key="chorus", max_retries=0)
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="over a socket")
        response_id = next(e for e in conn if e.type == "response.completed").response.id
    line = pair.b.wait_line(rf"^gateway \| .*POST /v1/chat/completions 200 .*id={ids[pair.b.port]}", 10)
    assert "api=chat" in line and f"model={MODEL}" in line, line
    assert "api=responses" in pair.b.wait_line(rf"^gateway \| .*WS /v1/responses 200 .*request_id={response_id}", 10)
    assert not [x for x in pair.a.lines if x.startswith("gateway | ")], pair.a.output  # --quiet
    for stack in (pair.a, pair.b):
        assert "NATS: using the server already running at nats://" in stack.output, stack.output
        assert "Redis: using the server already running at redis://" in stack.output, stack.output


def test_a_starting_engine_is_no_alarm(pair: Pair) -> None:
    """The simulated engine starts beside the dispatcher: no "is down" warning, no NOT READY."""
    for stack in (pair.a, pair.b):
        assert "NOT READY" not in stack.output
        assert stack.log_dir is not None
        dispatcher = (stack.log_dir / "worker-1.log").read_text()
        assert " is down" not in dispatcher, dispatcher


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_whole_stack_quickly(pair: Pair, sig: int) -> None:
    """(Runs after the tests above: it stops their stacks.) Every process is gone in under
    STOP_WITHIN_S, and neither `chorus up` nor any service printed a traceback."""
    stack = pair.a if sig == signal.SIGINT else pair.b
    assert stack.proc.poll() is None
    assert len(stack.children()) >= 4  # sim-engine, a worker, tools, gateway
    took = stack.stop(sig)
    print(f"stopped by {signal.Signals(sig).name} in {took:.2f}s")
    assert stack.proc.returncode == 0
    assert took < STOP_WITHIN_S, f"{took:.2f}s"
    everything = stack.output + stack.logs()
    assert "Traceback" not in everything, everything
    assert "lost the NATS connection" not in everything  # services stopped before their bus


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
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)  # the kernel's SIGTERM to an orphan: nothing to wait on but its pid
        assert not any(_running(pid) for pid in workers)
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
