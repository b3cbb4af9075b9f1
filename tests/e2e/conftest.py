"""Whole-stack fixtures: `chorus up` as a user runs it (real services as processes, real NATS
and Redis), in front of the simulated engine speaking the vLLM or SGLang protocol."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.infra import ManagedProcess, free_port, wait_for_port
from tests.leftovers import LOGS
from tests.waiting import wait_until

MODEL = "openai/gpt-oss-20b"
Samples = dict[str, list[tuple[dict[str, str], float]]]  # /metrics: sample name -> (labels, value)
EngineRecord = dict[str, Any]  # one request as the simulated engine recorded it (its JSON)
# every process of a `chorus up` stack answers /metrics once: its workers as "worker", or
# with --split its encoders, dispatchers and parsers as themselves
SCRAPED = {False: ("gateway", "worker", "tools"), True: ("gateway", "encoder", "dispatcher", "parser", "tools")}


def samples_of(exposition: str) -> Samples:
    """A Prometheus text exposition's samples: each name's (labels, value) pairs."""
    out: Samples = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` that carry ``labels``."""
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == want for k, want in labels.items()))


@dataclass
class RunningStack:
    name: str
    base_url: str
    namespace: str
    log_dir: Path
    proc: subprocess.Popen[bytes]
    engine_url: str | None = None
    extra: list[ManagedProcess] = field(default_factory=list)
    nats_url: str = ""
    redis_url: str = ""
    split: bool = False  # `chorus up --split`: encoders, dispatchers and parsers, not workers

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(
            **{"base_url": f"{self.base_url}/v1", "api_key": "chorus", "max_retries": 0, "timeout": 30, **kw}
        )

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            **{"base_url": f"{self.base_url}/v1", "api_key": "chorus", "max_retries": 0, "timeout": 30, **kw}
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30)

    def metrics(self) -> Samples:
        """The gateway's /metrics now, every service in it: each sample name's (labels, value)
        pairs. A scrape waits a moment for each instance's answer and serves without the late
        ones (a loaded machine): such a scrape is taken again, so that a counter compared across
        two scrapes never seems to grow from nothing."""
        answered: set[str | None] = set()

        def whole() -> Samples | None:
            resp = httpx.get(f"{self.base_url}/metrics", timeout=30)
            assert resp.status_code == 200, resp.text
            out = samples_of(resp.text)
            answered.clear()
            answered.update(labels.get("service") for samples in out.values() for labels, _ in samples)
            counted: dict[str, float] = {}  # the scraped gateway's own come first (a replica's are its last scrape's)
            for labels, v in out.get("chorus_metrics_scrape_instances", []):
                counted.setdefault(labels["state"], v)
            whole = counted.get("answered", 0) >= counted.get("expected", 1)  # every process the gateway knows
            return out if whole and answered >= set(SCRAPED[self.split]) else None

        return wait_until(
            whole, 20, lambda: f"a scrape with every service of {SCRAPED[self.split]} (had {answered})", every=0.2
        )

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` in the gateway's /metrics that carry ``labels``."""
        return total(self.metrics(), name, **labels)

    def start_gateway(self, name: str = "gateway-b") -> tuple[ManagedProcess, str]:
        """Another gateway replica of this stack (same namespace, NATS and Redis), logging to
        ``name``.log beside the stack's logs: the process and its /v1 URL (``stop`` it)."""
        port = free_port()
        env = {
            **os.environ,
            "CHORUS_NAMESPACE": self.namespace,
            "CHORUS_PORT": str(port),
            "CHORUS_MODELS": json.dumps([MODEL]),
            "CHORUS_NATS_URL": self.nats_url,
            "CHORUS_REDIS_URL": self.redis_url,
        }
        proc = ManagedProcess(name, [sys.executable, "-m", "services.cli", "serve", "gateway"])
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc.proc = subprocess.Popen(proc.args, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port("127.0.0.1", port, proc, timeout=30)
        return proc, f"http://127.0.0.1:{port}/v1"

    def engine_requests(self) -> list[EngineRecord]:
        assert self.engine_url
        records: list[EngineRecord] = httpx.get(f"{self.engine_url}/sim/requests", timeout=5).json()
        return records

    def wait_engine(self, predicate: Callable[[EngineRecord], object], timeout: float = 10.0) -> EngineRecord:
        """Wait until the engine has recorded a request for which ``predicate`` is truthy."""
        return wait_until(
            lambda: next((record for record in self.engine_requests() if predicate(record)), None),
            timeout,
            lambda: f"the engine recording a matching request (its last: {self.engine_requests()[-3:]})",
        )

    def engine_prompt(self, request_id: str) -> str:
        """The prompt text the engine received for the (last) generation of ``request_id``
        (a chat completion id or a response id)."""
        matches = [r for r in self.engine_requests() if request_id in (r.get("request_id") or "")]
        assert matches, f"the engine saw no request for {request_id}"
        record = matches[-1]
        if record.get("prompt_text"):
            return str(record["prompt_text"])
        from services.common.harmony import harmony_encoding

        text: str = harmony_encoding().decode_utf8(record["prompt_token_ids"])
        return text

    def children(self, needle: str) -> list[int]:
        """Pids of `chorus up`'s children whose command line contains ``needle``
        (e.g. "serve worker", "nats-server")."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if ppid == self.proc.pid and needle in cmdline:
                    pids.append(int(entry.name))
        return sorted(pids)

    def wait_children(self, needle: str, count: int, timeout: float = 30.0) -> list[int]:
        """The pids of ``count`` children matching ``needle``, once there are that many (a
        child killed twice within half a minute is restarted after a delay)."""
        pids: list[int] = []

        def counted() -> bool:
            pids[:] = self.children(needle)
            return len(pids) == count

        wait_until(counted, timeout, lambda: f"{count} processes matching {needle!r}, not {len(pids)}\n{self.logs()}")
        return pids

    def wait_healthy(self, timeout: float = 30.0) -> None:
        wait_until(
            lambda: _health(self.base_url)[0] == 200, timeout, lambda: f"stack {self.name} healthy again\n{self.logs()}"
        )

    def log(self, name: str) -> str:
        """One process's whole log (``gateway``, ``worker-1``, ``up`` ...)."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        out = []
        for f in sorted(self.log_dir.glob("*.log")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in self.extra:
            p.stop()


def _health(base_url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(Exception):
            return exc.code, json.loads(exc.read())
        return exc.code, {}
    except Exception:  # noqa: BLE001
        return 0, {}


def start_sim_engine(
    protocol: str,
    incremental: bool = False,
    log_dir: Path | None = None,
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> tuple[ManagedProcess, str]:
    """A simulated engine as a process: (the process, its URL); ``env`` adds its settings."""
    port = port or free_port()
    env = {
        **os.environ,
        "CHORUS_SIM_HOST": "127.0.0.1",
        "CHORUS_SIM_PORT": str(port),
        "CHORUS_SIM_PROTOCOL": protocol,
        "CHORUS_SIM_SGLANG_INCREMENTAL": "true" if incremental else "false",
        **(env or {}),
    }
    proc = ManagedProcess("sim-engine", [sys.executable, "-m", "services.cli", "serve", "sim-engine"])
    out = open(log_dir / "sim-engine.log", "ab") if log_dir else subprocess.DEVNULL  # noqa: SIM115
    proc.proc = subprocess.Popen(proc.args, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_for_port("127.0.0.1", port, proc, timeout=30)
    return proc, f"http://127.0.0.1:{port}"


def start_stack(
    name: str,
    nats_url: str,
    redis_url: str,
    *,
    engines: list[str] | None = None,
    engine_url: str | None = None,
    expect_ready: bool = True,
    extra_args: list[str] | None = None,
    extra: list[ManagedProcess] | None = None,
    env: dict[str, str] | None = None,
) -> RunningStack:
    port = free_port()
    namespace = f"e2e{uuid.uuid4().hex[:8]}"
    log_dir = Path(tempfile.mkdtemp(prefix=f"chorus-{name}-", dir=LOGS.root))
    args = [
        sys.executable,
        "-m",
        "services.cli",
        "up",
        "--port",
        str(port),
        "--namespace",
        namespace,
        "--nats-url",
        nats_url,
        "--redis-url",
        redis_url,
        "--log-dir",
        str(log_dir),
        "--model",
        MODEL,
        *(extra_args or []),
    ]
    if engines:
        for e in engines:
            args += ["--engine", e]
    else:
        sim_port = free_port()
        args += ["--sim-port", str(sim_port)]
        engine_url = f"http://127.0.0.1:{sim_port}"
    proc = subprocess.Popen(
        args,
        stdout=open(log_dir / "up.log", "ab"),  # noqa: SIM115 - the process holds it
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    stack = RunningStack(
        name,
        f"http://127.0.0.1:{port}",
        namespace,
        log_dir,
        proc,
        engine_url,
        extra or [],
        nats_url,
        redis_url,
        split="--split" in (extra_args or []),
    )

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"chorus up exited with {proc.returncode}\n{stack.logs()}")
        status, body = _health(stack.base_url)
        return status == 200 or (
            not expect_ready and status == 503 and bool(body.get("services", {}).get("parser", {}).get("ready"))
        )

    try:
        wait_until(up, 90, lambda: f"stack {name} healthy\n{stack.logs()}", every=0.1)
    except BaseException:
        stack.stop()
        raise
    return stack


class Stacks:
    """Session-wide stacks, started on first use and stopped at the end."""

    def __init__(self, nats_url: str, redis_url: str) -> None:
        self.nats_url, self.redis_url = nats_url, redis_url
        self._stacks: dict[str, RunningStack] = {}
        self.builtin_port = 0

    def get(self, name: str) -> RunningStack:
        if name not in self._stacks:
            self._stacks[name] = self._start(name)
        return self._stacks[name]

    def _start(self, name: str) -> RunningStack:
        if name == "vllm":  # chorus up's own embedded simulator (vLLM protocol)
            return start_stack(name, self.nats_url, self.redis_url)
        if name in ("sglang", "sglang-incremental"):
            sim, url = start_sim_engine("sglang", incremental=name.endswith("incremental"))
            return start_stack(
                name,
                self.nats_url,
                self.redis_url,
                engines=[f"sglang={url}"],
                engine_url=url,
                extra=[sim],
                # the roles as processes of their own (every generation crosses the bus four
                # times): the vLLM stacks run `chorus up`'s default, workers
                extra_args=["--split"],
            )
        if name == "mcp":  # short tool timeouts, for the hanging-tool test
            return start_stack(
                name,
                self.nats_url,
                self.redis_url,
                env={"CHORUS_MCP_CALL_TIMEOUT_S": "1.5", "CHORUS_MAX_CALL_TIMEOUT_S": "1.5"},
            )
        if name == "builtin":  # a browser built-in routed to an MCP server the test serves
            port = free_port()
            self.builtin_port = port
            return start_stack(
                name,
                self.nats_url,
                self.redis_url,
                extra_args=["--builtin-tool", f"browser=http://127.0.0.1:{port}/mcp"],
            )
        if name == "engine-down":
            dead = f"http://127.0.0.1:{free_port()}"
            return start_stack(name, self.nats_url, self.redis_url, engines=[f"vllm={dead}"], expect_ready=False)
        raise KeyError(name)

    def stop(self) -> None:
        for stack in self._stacks.values():
            stack.stop()


@pytest.fixture(scope="session")
def stacks(nats_url: str, redis_url: str) -> Iterator[Stacks]:
    s = Stacks(nats_url, redis_url)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def stack(stacks: Stacks) -> RunningStack:
    return stacks.get("vllm")


@pytest.fixture(scope="session", params=["vllm", "sglang", "sglang-incremental"])
def any_stack(request: pytest.FixtureRequest, stacks: Stacks) -> RunningStack:
    return stacks.get(request.param)
