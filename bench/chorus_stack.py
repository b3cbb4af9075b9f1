"""The stack a benchmark measures, as processes: the simulated engine and `chorus up` in front of
it (``Stack``), and what /proc tells of their processes: the Chorus services under `chorus up`,
their CPU seconds and resident memory. Linux only (it reads /proc)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.infra import free_port  # noqa: E402

SERVICES = ("gateway", "worker", "encoder", "dispatcher", "parser", "tools")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def add_shape_argument(ap: argparse.ArgumentParser) -> None:
    """``--split``: the stack's encoder, dispatcher and parsers as processes of their own
    (`chorus up --split`) instead of its default workers."""
    ap.add_argument(
        "--split",
        dest="up_args",
        action="store_const",
        const=["--split"],
        default=[],
        help="run the encoder, dispatcher and parsers as processes of their own (`chorus up --split`)",
    )


def proc_cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def child_pids(parent: int) -> dict[int, str]:
    """The processes whose parent is ``parent``, with their command lines."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found[int(entry.name)] = proc_cmdline(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def is_service(pid: int) -> bool:
    """Whether ``pid`` is (still) a `services.cli` process, not a zombie or a reused pid."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and "services.cli" in proc_cmdline(pid)
    except (OSError, IndexError):
        return False


def chorus_services(up_pid: int) -> dict[int, str]:
    """Children of `chorus up` running `serve SERVICE` (one of ``SERVICES``)."""
    found: dict[int, str] = {}
    for pid, cmd in child_pids(up_pid).items():
        service = cmd.split("serve ", 1)[1].split()[0] if "serve " in cmd else ""
        if service in SERVICES:
            found[pid] = service
    names: dict[int, str] = {}
    counts: dict[str, int] = {}
    for pid, service in sorted(found.items()):
        counts[service] = counts.get(service, 0) + 1
        same = sum(1 for s in found.values() if s == service)
        names[pid] = f"{service}-{counts[service]}" if same > 1 else service
    return names


def cpu_seconds(pid: int) -> float:
    """utime + stime (fields 14 and 15 of /proc/PID/stat) in seconds; NaN when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields[0] is field 3 (state)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Stack:
    """The simulated engine and `chorus up` in front of it, with their logs; run from the code
    tree ``root`` (this one unless told: ``bench_ab.py`` starts one stack per tree)."""

    log_dir: Path
    root: Path = ROOT
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    base: str = ""
    engine: str = ""

    @property
    def sim(self) -> subprocess.Popen[bytes]:
        return self.procs[0]

    @property
    def up(self) -> subprocess.Popen[bytes]:
        return self.procs[1]

    def start(self, args: argparse.Namespace) -> None:
        sim_port, port = free_port(), free_port()
        self.engine = f"http://127.0.0.1:{sim_port}"
        self.base = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "CHORUS_SIM_HOST": "127.0.0.1",
            "CHORUS_SIM_PORT": str(sim_port),
            "CHORUS_SIM_PROTOCOL": "vllm",
            "CHORUS_SIM_TOKEN_DELAY_MS": "0",
            "CHORUS_SIM_TOKENS_PER_CHUNK": str(args.tokens_per_chunk),
            "CHORUS_SIM_LOG_LEVEL": "WARNING",
        }
        cli = [sys.executable, "-m", "services.cli"]
        with open(self.log_dir / "sim.log", "wb") as sim_log:
            self.procs.append(
                subprocess.Popen(
                    [*cli, "serve", "sim-engine"], env=env, cwd=self.root, stdout=sim_log, stderr=subprocess.STDOUT
                )
            )
        with open(self.log_dir / "up.out", "wb") as up_log:
            self.procs.append(
                subprocess.Popen(
                    [
                        *cli,
                        "up",
                        "--port",
                        str(port),
                        "--engine",
                        f"sim={self.engine}",
                        "--namespace",
                        f"bench{port}",
                        *getattr(args, "up_args", []),  # the tree's own default shape unless told
                        "--log-dir",
                        str(self.log_dir),
                        "--log-level",
                        "WARNING",
                    ],
                    cwd=self.root,
                    stdout=up_log,
                    stderr=subprocess.STDOUT,
                )
            )
        self._wait_healthy(90.0)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in (("sim-engine", self.sim), ("chorus up", self.up)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited during start-up (code {proc.returncode}); see {self.log_dir}")
            with contextlib.suppress(Exception), urllib.request.urlopen(f"{self.base}/health", timeout=2) as r:
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stack was not healthy after {timeout:.0f} s; see {self.log_dir}")
            time.sleep(0.2)

    def stop(self) -> None:
        """`chorus up` (it stops its services) and the engine; then whatever lingers: services
        of a `chorus up` that did not stop in time, by their pids."""
        services = list(child_pids(self.up.pid)) if len(self.procs) > 1 else []
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:  # e.g. still starting up: stop its services too
                services = sorted({*services, *child_pids(proc.pid)})
                for pid in services:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGTERM)
                proc.kill()
                proc.wait()
        deadline = time.monotonic() + 10
        while (alive := [pid for pid in services if is_service(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.base:
            forget_namespace(f"bench{self.base.rsplit(':', 1)[1]}")


def forget_namespace(namespace: str) -> None:
    """Remove what the stack stored under ``namespace`` in a Redis it shared (one `chorus up`
    started on its own went with it): stored responses expire, the sealing key would not."""
    with (
        contextlib.suppress(redis.RedisError),
        redis.Redis.from_url(
            os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), socket_connect_timeout=1
        ) as client,
    ):
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])


def show_logs(log_dir: Path, lines: int = 15) -> None:
    """The last lines of every non-empty log (the directory goes away unless --keep-logs)."""
    for log in sorted(log_dir.glob("*")):
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                print(f"--- {log.name} (last {len(tail)} lines)", file=sys.stderr)
                print("\n".join(tail), file=sys.stderr)


@dataclass(frozen=True)
class SimEngine:
    """Where one simulated engine of a ``Fleet`` answers, and publishes its KV cache events."""

    url: str
    kv_events: str
    kv_replay: str


def wait_ok(url: str, procs: dict[str, subprocess.Popen[bytes]], timeout: float, log_dir: Path) -> None:
    """Until ``url`` answers 200; ``RuntimeError`` if one of ``procs`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited during start-up (code {proc.returncode}); see {log_dir}")
        with contextlib.suppress(Exception), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f} s; see {log_dir}")
        time.sleep(0.2)


@dataclass
class Fleet(Stack):
    """Several simulated engines (vLLM protocol), each publishing its KV cache events on ports of
    its own (``start_engines``), and `chorus up` in front of them with the engine specs it is
    given (``start_up``); ``stop`` as ``Stack``'s (`chorus up` is the last process started)."""

    engines: list[SimEngine] = field(default_factory=list)

    @property
    def up(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def start_engines(self, count: int, settings: dict[str, str]) -> None:
        """``count`` engines with the ``CHORUS_SIM_*`` ``settings`` (beside their addresses)."""
        taken: set[int] = set()

        def port() -> int:
            while (p := free_port()) in taken:
                pass
            taken.add(p)
            return p

        cli = [sys.executable, "-m", "services.cli", "serve", "sim-engine"]
        started: dict[str, subprocess.Popen[bytes]] = {}
        for i in range(count):
            http, events, replay = port(), port(), port()
            engine = SimEngine(f"http://127.0.0.1:{http}", f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}")
            env = {
                **os.environ,
                "CHORUS_SIM_HOST": "127.0.0.1",
                "CHORUS_SIM_PORT": str(http),
                "CHORUS_SIM_PROTOCOL": "vllm",
                "CHORUS_SIM_LOG_LEVEL": "WARNING",
                "CHORUS_SIM_KV_EVENTS_ENDPOINT": engine.kv_events,
                "CHORUS_SIM_KV_EVENTS_REPLAY_ENDPOINT": engine.kv_replay,
                **settings,
            }
            with open(self.log_dir / f"sim-{i}.log", "wb") as log:
                proc = subprocess.Popen(cli, env=env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT)
            self.procs.append(proc)
            self.engines.append(engine)
            started[f"sim-engine {i}"] = proc
        for engine in self.engines:
            wait_ok(f"{engine.url}/health", started, 60.0, self.log_dir)

    def start_up(self, engine_specs: list[str], up_args: list[str]) -> None:
        """`chorus up` with one ``--engine`` per spec, and ``up_args``; returns once it is healthy."""
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        engines = [arg for spec in engine_specs for arg in ("--engine", spec)]
        with open(self.log_dir / "up.out", "wb") as up_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--port", str(port), *engines]
                + ["--namespace", f"bench{port}", *up_args, "--log-dir", str(self.log_dir), "--log-level", "WARNING"],
                cwd=self.root,
                stdout=up_log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        watched = {"chorus up": proc, **{f"sim-engine {i}": p for i, p in enumerate(self.procs[:-1])}}
        wait_ok(f"{self.base}/health", watched, 90.0, self.log_dir)
