"""`chorus` as a user runs it, as real processes (`python -m services.cli ...`) on this machine's
NATS and Redis: two stacks side by side answer only their own requests; a busy port or a
namespace another stack uses is refused at once with the flag to change; Ctrl-C and SIGTERM
stop a whole stack in under 3 s without a traceback; an unreachable engine is reported in
seconds (and a starting one is no alarm); `serve` and `ping` give up on an unreachable NATS
with one line and obey SIGTERM while trying; `--version`, `--help` defaults and JSON logs."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.infra.cli_process import (
    FAIL_FAST_S,
    MODEL,
    READY_WITHIN_S,
    STOP_WITHIN_S,
    Chorus,
    chat,
    engine_saw,
    engine_url,
    up,
)
from tests.waiting import wait_until


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
    # the access line is written once the response is sent
    wait_until(lambda: request_id in gateway_log.read_text(), 10, "the request's access line in gateway.log")
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
