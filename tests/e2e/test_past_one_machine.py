"""Chorus on more than one NATS server and more than one Redis, end to end: ``chorus up --split``
(every service its own process and connection) on real servers started here, on loopback.

- A three-node NATS cluster (JetStream replicated on all three, CHORUS_NATS_JETSTREAM_REPLICAS=3)
  given as ``nats://a,nats://b,nats://c``: the node the gateway is connected to is SIGKILLed
  under twelve streams; every stream says exactly what an undisturbed run said, none pauses
  for 3 s or more, and a message too large for NATS (carried through JetStream) still goes.
- Redis through Sentinel (``redis+sentinel://``, a primary, two replicas, three sentinels): the
  primary SIGKILLed under six Responses streams, each completes (stored); a conversation stored
  before goes on after the failover (a
  configuration that cannot work: tests/gateway/test_redis_sentinel.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.infra import ManagedProcess, free_port, nats_server_binary, wait_for_port
from tests.e2e.conftest import MODEL, RunningStack, start_stack
from tests.e2e.streams import kill, run_streams
from tests.redis_topology import Topology, topology
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

STREAMS = 12
MAX_PAUSE_S = 3.0
MAX_PAYLOAD = 64 * 1024  # the cluster's limit: a long prompt's messages go as claims


def say(text: str) -> str:
    """The directive making the simulated model answer exactly ``text``."""
    return f"[[sim:raw=<|channel|>final<|message|>{text}<|return|>]]"


@dataclass
class NatsNode:
    port: int
    monitor: int
    proc: ManagedProcess

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.monitor}{path}", timeout=2).json()
        return answer


def start_cluster(directory: Path, size: int = 3, attempts: int = 3) -> list[NatsNode]:
    """``size`` nats-servers routed to each other, JetStream on each (its own store), with a
    JetStream meta leader. Ports are picked free and then bound by the servers, so another
    process can take one in between: a cluster that does not come up is stopped and started
    again on fresh ports, and the last try's failure carries every node's log."""
    for attempt in range(attempts):
        nodes = _launch_cluster(directory / f"try-{attempt}", size)
        try:
            for node in nodes:
                wait_for_port("127.0.0.1", node.port, node.proc)
            wait_until(partial(all_ready, nodes), 30, "the cluster's JetStream", every=0.2)
            return nodes
        except (AssertionError, RuntimeError, TimeoutError) as exc:
            for node in nodes:
                node.proc.stop()
            if attempt == attempts - 1:
                logs = "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}" for f in sorted(directory.rglob("*.log")))
                raise AssertionError(f"no NATS cluster in {attempts} tries: {exc}\n{logs}") from exc
    raise AssertionError("unreachable")


def _launch_cluster(directory: Path, size: int) -> list[NatsNode]:
    directory.mkdir(parents=True)
    ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
    nodes = []
    for i, (port, cport, monitor) in enumerate(ports):
        routes = ",".join(f"nats://127.0.0.1:{c}" for _, c, _ in ports if c != cport)
        store = directory / f"js-{i}"
        conf = directory / f"nats-{i}.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\nserver_name: n{i}\n"
            f"max_payload: {MAX_PAYLOAD}\njetstream {{ store_dir: {str(store)!r} }}\n"
            f"cluster {{ name: chorus-e2e, listen: 127.0.0.1:{cport}, routes: [{routes}] }}\n"
        )
        proc = ManagedProcess(f"nats-{i}", [nats_server_binary(), "-c", str(conf)])
        proc.start(directory / f"nats-{i}.log")
        nodes.append(NatsNode(port, monitor, proc))
    return nodes


def all_ready(nodes: list[NatsNode]) -> bool:
    return all(jetstream_ready(n) for n in nodes)


def pid_of(proc: ManagedProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


def jetstream_ready(node: NatsNode) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{node.monitor}/healthz?js-enabled-only=true", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def connected_to(node: NatsNode, prefix: str) -> bool:
    return any(c.get("name", "").startswith(prefix) for c in node.get("/connz?limit=1024").get("connections", []))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NatsNode]]:
    nodes = start_cluster(tmp_path_factory.mktemp("nats-cluster"))
    yield nodes
    for node in nodes:
        node.proc.stop()


def test_a_nats_node_killed_under_twelve_streams(cluster: list[NatsNode], redis_url: str) -> None:
    stack = start_stack(
        "nats-cluster",
        ",".join(n.url for n in cluster),
        redis_url,
        extra_args=["--split"],
        env={"CHORUS_NATS_JETSTREAM_REPLICAS": "3"},
    )
    try:
        want = asyncio.run(run_streams(stack, "chat", count=STREAMS))
        [node] = [n for n in cluster if connected_to(n, "chorus-gateway-")]
        others = [n for n in cluster if n is not node]
        got = asyncio.run(run_streams(stack, "chat", lambda: kill(pid_of(node.proc)), count=STREAMS))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.error is None, f"stream {i}: {g.error}"
            assert (g.content, g.reasoning) == (w.content, w.reasoning), f"stream {i} differs"
            assert g.longest_pause < MAX_PAUSE_S, f"stream {i} paused {g.longest_pause:.2f}s"
        assert any(connected_to(n, "chorus-gateway-") for n in others)  # it moved to a live node
        metrics = httpx.get(f"{stack.base_url}/metrics", timeout=5).text
        assert re.search(
            r'chorus_nats_connection_events_total\{[^}]*event="reconnected"[^}]*service="gateway"', metrics
        )
        long_prompt(stack)  # JetStream (R3, one node of three down) carries what NATS cannot
        responses = stack.client().responses.create(model=MODEL, input=f"still here? {say('yes')}")
        assert responses.status == "completed"
    finally:
        stack.stop()


def long_prompt(stack: RunningStack) -> None:
    text = "lorem ipsum dolor sit amet " * (3 * MAX_PAYLOAD // 27)  # three times the limit
    answer = stack.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"{text} {say('read it')}"}]
    )
    assert answer.choices[0].message.content == "read it"
    [record] = [r for r in stack.engine_requests()[-3:] if "lorem ipsum" in r.get("prompt_text", "")]
    assert record["prompt_tokens"] > MAX_PAYLOAD // 8


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[Topology]:
    with topology(tmp_path, replicas=2) as topo:
        yield topo


def test_a_conversation_outlives_the_redis_primary(sentinel: Topology, nats_url: str) -> None:
    stack = start_stack("sentinel", nats_url, sentinel.url, extra_args=["--split"])
    try:
        client = stack.client()
        first = client.responses.create(model=MODEL, input=f"remember 42 {say('noted')}")
        assert first.output_text == "noted"
        # streams in flight when the primary is SIGKILLed: each one's storage is retried through
        # the failover, and each ends completed (its response stored), none failed
        got = asyncio.run(run_streams(stack, "responses", lambda: kill(pid_of(sentinel.primary)), count=6))
        assert [g.error for g in got] == [None] * len(got)
        assert all(g.content for g in got)
        # the first turn was acknowledged by a replica (CHORUS_REDIS_MIN_REPLICAS=1 with
        # Sentinel): the next turn finds it on the new primary. A save waits for the other
        # replica to follow that primary: until then it is refused (a 503 the client retries),
        # never stored on one server only
        second = client.with_options(timeout=60, max_retries=10).responses.create(
            model=MODEL, input=f"what was it? {say('42')}", previous_response_id=first.id
        )
        assert second.output_text == "42"
        [record] = [r for r in stack.engine_requests() if "what was it?" in r.get("prompt_text", "")]
        assert "remember 42" in record["prompt_text"]  # the first turn was rendered from storage
    finally:
        stack.stop()
