"""Benchmark (not a test): the whole Chorus pipeline against its targets, in one run.

Starts the simulated engine (vLLM protocol, zero delay) as its own process and `chorus up` in
front of it, then measures, against that same engine:
  1. added time to first token at concurrency 1 (direct and Chorus requests alternated, after
     warm-up): p50 and p99 of each side and their differences;
  2. output tokens/s at concurrency 64, first directly on the engine, then through Chorus, and the
     ratio chorus/direct;
  3. CPU seconds per output token of the Chorus service processes (gateway, encoder, dispatcher,
     parser workers, tools) over the Chorus throughput run;
  4. peak RSS of each Chorus service process under that load (sampled every 0.5 s).
and prints them beside their targets. One client library (aiohttp) for both sides.

    python bench/bench_pipeline.py [--quick] [--json PATH] [--keep-logs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.harmony import harmony_encoding  # noqa: E402
from services.common.infra import free_port  # noqa: E402

MODEL = "openai/gpt-oss-20b"
MESSAGE_TOKEN = 200008  # <|message|>: the first id after it is the first content token
STOP_TOKEN_IDS = [200002, 200012]  # <|return|>, <|call|>
SERVICES = ("gateway", "encoder", "dispatcher", "parser", "tools")
CLK_TCK = os.sysconf("SC_CLK_TCK")
WARMUP = 20

# figure key -> (label, target text, predicate on the measured value)
TARGETS: dict[str, tuple[str, str, Callable[[float], bool]]] = {
    "added_ttft_p50_ms": ("added TTFT p50, c=1, engine at zero delay", "<= 3 ms", lambda v: v <= 3.0),
    "paced_added_ttft_p50_ms": ("added TTFT p50, c=1, engine paced", "<= 3 ms", lambda v: v <= 3.0),
    "throughput_ratio": ("tokens/s chorus / direct, c=64", ">= 0.5x", lambda v: v >= 0.5),
    "cpu_us_per_token": ("CPU per output token, Chorus services", "<= 40 us", lambda v: v <= 40.0),
    "peak_rss_mb": ("peak RSS per Chorus service, c=64", "<= 150 MB", lambda v: v <= 150.0),
    # not a target of its own: figures that leave failed requests out are not comparable
    "failed_requests": ("requests failed (both sides, all runs)", "0", lambda v: v == 0),
}


# ------------------------------------------------------------------------------------ helpers


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def prompt_ids(text: str) -> list[int]:
    """The Harmony token ids Chorus renders for this one-message chat (default system message)."""
    from openai_harmony import Conversation, Message, Role, SystemContent

    conv = Conversation.from_messages([
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
        Message.from_role_and_content(Role.USER, text),
    ])
    return list(harmony_encoding().render_conversation_for_completion(conv, Role.ASSISTANT))


def chat_text(tokens: int, delay_ms: float = 0.0) -> str:
    pace = f" [[sim:delay_ms={delay_ms:g}]]" if delay_ms else ""
    return f"Benchmark question [[sim:tokens={tokens}]]{pace}"


def count_ids(line: bytes) -> int:
    """Token ids in a vLLM stream line's ``"token_ids":[...]``, without parsing the JSON."""
    start = line.find(b'"token_ids":[')
    if start < 0:
        return 0
    start += len(b'"token_ids":[')
    end = line.find(b"]", start)
    body = line[start:end].strip()
    return body.count(b",") + 1 if body else 0


# ------------------------------------------------------------------------------------ clients


@dataclass
class Result:
    ttft: float  # seconds to the first content token (0 when none came)
    total: float  # seconds to the end of the stream
    tokens: int  # output tokens: ids received (direct) or usage.completion_tokens (chorus)
    usage_tokens: int = 0  # the usage chunk's completion_tokens (both sides, as a cross-check)


class RequestFailed(Exception):
    """One benchmark request that did not complete (HTTP error or an error in the stream)."""


async def check_status(resp: aiohttp.ClientResponse) -> None:
    if resp.status != 200:
        text = (await resp.text(errors="replace")).strip()
        raise RequestFailed(f"HTTP {resp.status}: {text[:300]}")


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The ``data:`` lines of an event stream, ``[DONE]`` left out; everything that has arrived
    is split at once (one wake-up per network read, not per line)."""
    rest = b""
    async for data in resp.content.iter_any():
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                yield line
    if rest.startswith(b"data: ") and not rest.startswith(b"data: [DONE]"):
        yield rest


async def direct_once(http: aiohttp.ClientSession, engine: str, ids: list[int]) -> Result:
    """Stream one completion from the engine with the rendered prompt ids."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": None, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "skip_special_tokens": False, "stop_token_ids": STOP_TOKEN_IDS}
    t0 = time.perf_counter()
    ttft = 0.0
    seen_message = False
    tokens = usage = 0
    async with http.post(f"{engine}/v1/completions", json=body) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            if not ttft:  # parse until the first content token; then only count
                chunk = json.loads(raw[6:])
                if chunk.get("error"):
                    raise RequestFailed(f"engine error: {chunk['error']}")
                for choice in chunk.get("choices") or ():
                    for tid in choice.get("token_ids") or ():
                        tokens += 1
                        if seen_message and not ttft:
                            ttft = time.perf_counter() - t0
                        seen_message = seen_message or tid == MESSAGE_TOKEN
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
            elif b'"error"' in raw:
                raise RequestFailed(f"engine error: {raw[6:306].decode(errors='replace')}")
            elif b'"usage"' in raw and b'"usage":null' not in raw:
                usage = json.loads(raw[6:])["usage"]["completion_tokens"]
            else:
                tokens += count_ids(raw)
    if not usage:
        raise RequestFailed("the engine's stream ended without its usage chunk")
    return Result(ttft, time.perf_counter() - t0, tokens, usage)


async def chorus_once(http: aiohttp.ClientSession, base: str, text: str) -> Result:
    """Stream one chat completion through Chorus."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = 0.0
    usage = 0
    async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            if ttft and b'"usage"' not in raw and b'"error"' not in raw:
                continue  # after the first content chunk only usage (or an error) matters
            chunk = json.loads(raw[6:])
            if chunk.get("error"):
                raise RequestFailed(f"chorus error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            if not ttft:
                for choice in chunk.get("choices") or ():
                    d = choice.get("delta") or {}
                    if (d.get("reasoning") or d.get("reasoning_content") or d.get("content")
                            or d.get("tool_calls")):
                        ttft = time.perf_counter() - t0
                        break
    if not usage:
        raise RequestFailed("Chorus's stream ended without its usage chunk")
    return Result(ttft, time.perf_counter() - t0, usage, usage)


@dataclass
class Load:
    """The completed requests of a run and the errors of the others."""

    results: list[Result] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def call(self, fn: Callable[[], Awaitable[Result]]) -> None:
        try:
            self.results.append(await fn())
        except (RequestFailed, aiohttp.ClientError, TimeoutError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")


async def run_load(fn: Callable[[], Awaitable[Result]], n: int, concurrency: int) -> Load:
    load = Load()
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            await load.call(fn)

    await asyncio.gather(*(one() for _ in range(n)))
    return load


def note_errors(figures: dict[str, Any], run: str, load: Load) -> None:
    """Failed requests are left out of the figures but counted and shown."""
    if not load.errors:
        return
    figures.setdefault("errors", {})[run] = {"count": len(load.errors), "first": load.errors[0]}
    print(f"  WARNING: {len(load.errors)} {run} request(s) failed (left out of the figures); "
          f"first: {load.errors[0]}")


# ---------------------------------------------------------------------------------- processes


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
    """Children of `chorus up` running `serve gateway|encoder|dispatcher|parser|tools`."""
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
    """The simulated engine and `chorus up` in front of it, with their logs."""

    log_dir: Path
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
        env = {**os.environ, "CHORUS_SIM_HOST": "127.0.0.1", "CHORUS_SIM_PORT": str(sim_port),
               "CHORUS_SIM_PROTOCOL": "vllm", "CHORUS_SIM_TOKEN_DELAY_MS": "0",
               "CHORUS_SIM_TOKENS_PER_CHUNK": str(args.tokens_per_chunk),
               "CHORUS_SIM_LOG_LEVEL": "WARNING"}
        cli = [sys.executable, "-m", "services.cli"]
        with open(self.log_dir / "sim.log", "wb") as sim_log:
            self.procs.append(subprocess.Popen([*cli, "serve", "sim-engine"], env=env, cwd=ROOT,
                                               stdout=sim_log, stderr=subprocess.STDOUT))
        with open(self.log_dir / "up.out", "wb") as up_log:
            self.procs.append(subprocess.Popen(
                [*cli, "up", "--port", str(port), "--engine", f"sim={self.engine}",
                 "--namespace", f"bench{port}", "--parser-workers", str(args.parser_workers),
                 "--log-dir", str(self.log_dir), "--log-level", "WARNING"],
                cwd=ROOT, stdout=up_log, stderr=subprocess.STDOUT))
        self._wait_healthy(90.0)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in (("sim-engine", self.sim), ("chorus up", self.up)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited during start-up (code {proc.returncode}); "
                                       f"see {self.log_dir}")
            with contextlib.suppress(Exception), \
                    urllib.request.urlopen(f"{self.base}/health", timeout=2) as r:
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stack was not healthy after {timeout:.0f} s; "
                                   f"see {self.log_dir}")
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


# ---------------------------------------------------------------------------------- the runs


def latency_figures(rows: list[Result]) -> dict[str, float]:
    ttft = [r.ttft * 1000 for r in rows]
    total = [r.total * 1000 for r in rows]
    return {"ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "total_p50_ms": pct(total, 50), "total_p99_ms": pct(total, 99), "n": len(rows)}


async def measure_ttft(http: aiohttp.ClientSession, stack: Stack, args: argparse.Namespace,
                       figures: dict[str, Any], delay_ms: float = 0.0, key: str = "") -> None:
    """Added TTFT at concurrency 1. At zero delay the engine sends the whole answer in one
    burst, so the first text token competes for the 2 cores with the rest of it; ``delay_ms``
    paces the engine like a real one (a decode step per token) on both sides."""
    tokens = 4 if delay_ms else args.tokens  # a paced answer's length does not change its TTFT
    requests = max(10, args.requests // 2) if delay_ms else args.requests
    text = chat_text(tokens, delay_ms)
    ids = prompt_ids(text)
    for _ in range(WARMUP):  # a failure here is fatal: the stack is not working
        await direct_once(http, stack.engine, ids)
        await chorus_once(http, stack.base, text)
    direct, chorus = Load(), Load()
    calls = (lambda: direct_once(http, stack.engine, ids), lambda: chorus_once(http, stack.base, text))
    for i in range(requests):  # alternated, and which side goes first alternates too
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            await (direct, chorus)[j].call(calls[j])
    for side, load in (("direct", direct), ("chorus", chorus)):
        missing = sum(1 for r in load.results if not r.ttft)
        if missing or not load.results:
            raise RuntimeError(f"{side}: {missing} request(s) had no content token, "
                               f"{len(load.errors)} failed {load.errors[:1]}")
    d, c = latency_figures(direct.results), latency_figures(chorus.results)
    figures[f"{key}ttft"] = {"direct": d, "chorus": c}
    figures[f"{key}added_ttft_p50_ms"] = c["ttft_p50_ms"] - d["ttft_p50_ms"]
    figures[f"{key}added_ttft_p99_ms"] = c["ttft_p99_ms"] - d["ttft_p99_ms"]
    pace = f"engine paced at {delay_ms:g} ms per token" if delay_ms else "engine at zero delay"
    print(f"TTFT at concurrency 1, {pace}, {tokens}-token answers, {requests} requests per "
          f"side (alternated, after {WARMUP} warm-up each):")
    for name, f in (("direct", d), ("chorus", c)):
        print(f"  {name:<7} TTFT p50 {f['ttft_p50_ms']:7.2f} ms  p99 {f['ttft_p99_ms']:7.2f} ms"
              f"   total p50 {f['total_p50_ms']:7.2f} ms  p99 {f['total_p99_ms']:7.2f} ms")
    print(f"  added   TTFT p50 {figures[f'{key}added_ttft_p50_ms']:+7.2f} ms  "
          f"p99 {figures[f'{key}added_ttft_p99_ms']:+7.2f} ms")
    note_errors(figures, f"{key}ttft direct", direct)
    note_errors(figures, f"{key}ttft chorus", chorus)


async def measure_throughput(http: aiohttp.ClientSession, stack: Stack, args: argparse.Namespace,
                             figures: dict[str, Any]) -> None:
    text = chat_text(args.throughput_tokens)
    ids = prompt_ids(text)
    n, conc = args.throughput_requests, args.concurrency
    print(f"throughput at concurrency {conc}: {n} requests of ~{args.throughput_tokens} tokens, "
          f"{args.tokens_per_chunk} token(s) per engine event:")

    sim_cpu0, client_cpu0 = cpu_seconds(stack.sim.pid), time.process_time()
    t0 = time.perf_counter()
    direct = await run_load(lambda: direct_once(http, stack.engine, ids), n, conc)
    direct_wall = time.perf_counter() - t0
    direct_sim_cpu = cpu_seconds(stack.sim.pid) - sim_cpu0
    direct_client_cpu = time.process_time() - client_cpu0
    direct_tokens = sum(r.tokens for r in direct.results)
    if direct_tokens != sum(r.usage_tokens for r in direct.results):
        print(f"  WARNING: direct ids received {direct_tokens} != usage "
              f"{sum(r.usage_tokens for r in direct.results)}")
    if not direct_tokens:
        raise RuntimeError(f"the direct throughput run received no tokens {direct.errors[:1]}")

    services = chorus_services(stack.up.pid)
    if not services:
        raise RuntimeError("no Chorus service processes found under `chorus up`")
    peak = dict.fromkeys(services, 0.0)

    async def sample_rss() -> None:
        while True:
            for pid in services:
                peak[pid] = max(peak[pid], rss_mb(pid))
            await asyncio.sleep(0.5)

    cpu0 = {pid: cpu_seconds(pid) for pid in services}
    sim_cpu0, client_cpu0 = cpu_seconds(stack.sim.pid), time.process_time()
    sampler = asyncio.ensure_future(sample_rss())
    try:
        t0 = time.perf_counter()
        chorus = await run_load(lambda: chorus_once(http, stack.base, text), n, conc)
        chorus_wall = time.perf_counter() - t0
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    cpu = {pid: cpu_seconds(pid) - cpu0[pid] for pid in services}
    chorus_sim_cpu = cpu_seconds(stack.sim.pid) - sim_cpu0
    chorus_client_cpu = time.process_time() - client_cpu0
    for pid in services:
        peak[pid] = max(peak[pid], rss_mb(pid))
    chorus_tokens = sum(r.tokens for r in chorus.results)
    gone = [services[pid] for pid, v in cpu.items() if v != v]  # NaN: the process went away
    if gone:
        raise RuntimeError(f"Chorus service(s) exited during the run: {', '.join(gone)}")
    if not chorus_tokens:
        raise RuntimeError(f"Chorus returned no usage.completion_tokens {chorus.errors[:1]}")

    direct_tps, chorus_tps = direct_tokens / direct_wall, chorus_tokens / chorus_wall
    total_cpu = sum(cpu.values())
    figures["throughput"] = {
        "direct": {"tokens": direct_tokens, "wall_s": direct_wall, "tokens_per_s": direct_tps,
                   "engine_cpu_us_per_token": direct_sim_cpu / direct_tokens * 1e6,
                   "client_cpu_us_per_token": direct_client_cpu / direct_tokens * 1e6},
        "chorus": {"tokens": chorus_tokens, "wall_s": chorus_wall, "tokens_per_s": chorus_tps,
                   "engine_cpu_us_per_token": chorus_sim_cpu / chorus_tokens * 1e6,
                   "client_cpu_us_per_token": chorus_client_cpu / chorus_tokens * 1e6},
    }
    figures["direct_tokens_per_s"] = direct_tps
    figures["chorus_tokens_per_s"] = chorus_tps
    figures["throughput_ratio"] = chorus_tps / direct_tps
    figures["cpu_s"] = total_cpu
    figures["cpu_us_per_token"] = total_cpu / chorus_tokens * 1e6
    figures["cpu_us_per_token_by_service"] = {
        services[pid]: v / chorus_tokens * 1e6 for pid, v in cpu.items()}
    figures["peak_rss_mb_by_service"] = {services[pid]: mb for pid, mb in peak.items()}
    figures["peak_rss_mb"] = max(peak.values())

    for name, tokens, wall, tps, eng, client in (
        ("direct", direct_tokens, direct_wall, direct_tps, direct_sim_cpu, direct_client_cpu),
        ("chorus", chorus_tokens, chorus_wall, chorus_tps, chorus_sim_cpu, chorus_client_cpu),
    ):
        print(f"  {name:<7} {tokens:>8} tokens in {wall:7.2f} s = {tps:>9,.0f} tokens/s"
              f"   (CPU per token: engine {eng / tokens * 1e6:5.1f} us, "
              f"benchmark client {client / tokens * 1e6:5.1f} us)")
    print(f"  ratio chorus/direct {figures['throughput_ratio']:.3f}x")
    note_errors(figures, "throughput direct", direct)
    note_errors(figures, "throughput chorus", chorus)
    print(f"  Chorus service CPU over the chorus run: {total_cpu:.2f} s = "
          f"{figures['cpu_us_per_token']:.1f} us/token")
    print(f"  {'service':<12} {'pid':>7} {'CPU s':>8} {'us/token':>9} {'peak RSS':>10}")
    for pid, name in sorted(services.items(), key=lambda kv: kv[1]):
        print(f"  {name:<12} {pid:>7} {cpu[pid]:8.2f} {cpu[pid] / chorus_tokens * 1e6:9.1f} "
              f"{peak[pid]:7.1f} MB")


def print_summary(figures: dict[str, Any]) -> None:
    errors: dict[str, dict[str, Any]] = figures.get("errors", {})
    figures["failed_requests"] = sum(e["count"] for e in errors.values())
    shown = {
        "added_ttft_p50_ms": (f"{figures['added_ttft_p50_ms']:+.2f} ms "
                              f"(p99 {figures['added_ttft_p99_ms']:+.2f} ms)"),
        "paced_added_ttft_p50_ms": (f"{figures['paced_added_ttft_p50_ms']:+.2f} ms "
                                    f"(p99 {figures['paced_added_ttft_p99_ms']:+.2f} ms, "
                                    f"{figures['config']['paced_ms']:g} ms/token)"),
        "throughput_ratio": (f"{figures['throughput_ratio']:.3f}x "
                             f"({figures['chorus_tokens_per_s']:,.0f} / "
                             f"{figures['direct_tokens_per_s']:,.0f} tokens/s)"),
        "cpu_us_per_token": f"{figures['cpu_us_per_token']:.1f} us",
        "peak_rss_mb": (f"{figures['peak_rss_mb']:.1f} MB (" + max(
            figures["peak_rss_mb_by_service"].items(), key=lambda kv: kv[1])[0] + ")"),
        "failed_requests": ", ".join(f"{e['count']} {run}" for run, e in errors.items()) or "0",
    }
    figures["met"] = {}
    print()
    print(f"| {'figure':<40} | {'measured':<42} | {'target':<9} | {'':<6} |")
    print(f"|{'-' * 42}|{'-' * 44}|{'-' * 11}|{'-' * 8}|")
    for key, (label, target, ok) in TARGETS.items():
        met = ok(figures[key])
        figures["met"][key] = met
        print(f"| {label:<40} | {shown[key]:<42} | {target:<9} | {'met' if met else 'MISSED':<6} |")
    for run, err in errors.items():
        print(f"WARNING: {err['count']} {run} request(s) failed and are not in the figures; "
              f"first: {err['first']}")


async def run(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "keep_logs")},
        "cores": os.cpu_count(),
    }
    print(f"Chorus pipeline benchmark on {os.cpu_count()} cores: simulated engine (vLLM, zero "
          f"delay, {args.tokens_per_chunk} token(s) per event) at {stack.engine}, Chorus at "
          f"{stack.base} with {args.parser_workers} parser workers; code under {ROOT}")
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await measure_ttft(http, stack, args, figures)
        await measure_ttft(http, stack, args, figures, args.paced_ms, "paced_")
        await measure_throughput(http, stack, args, figures)
    print_summary(figures)
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200, help="TTFT requests per side at concurrency 1")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens of the TTFT requests")
    ap.add_argument("--paced-ms", type=float, default=5.0,
                    help="the paced TTFT run's engine decode step per token (a real engine's pace)")
    ap.add_argument("--throughput-tokens", type=int, default=2000)
    ap.add_argument("--throughput-requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens-per-chunk", type=int, default=1,
                    help="tokens the simulated engine sends per stream event")
    ap.add_argument("--parser-workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 30 requests, 20 throughput requests of 500 tokens")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    ap.add_argument("--keep-logs", action="store_true", help="keep the services' log directory")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.throughput_requests, args.throughput_tokens = 30, 20, 500
    return args


def show_logs(log_dir: Path, lines: int = 15) -> None:
    """The last lines of every non-empty log (the directory goes away unless --keep-logs)."""
    for log in sorted(log_dir.glob("*")):
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                print(f"--- {log.name} (last {len(tail)} lines)", file=sys.stderr)
                print("\n".join(tail), file=sys.stderr)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # clean up on SIGTERM as on Ctrl-C
    stack = Stack(Path(tempfile.mkdtemp(prefix="chorus-bench-pipeline-")))
    code = 1
    try:
        stack.start(args)
        figures = asyncio.run(run(args, stack))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
            print(f"figures written to {args.json}")
        code = 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except (TimeoutError, RuntimeError, OSError, aiohttp.ClientError) as exc:
        print(f"benchmark failed: {exc!r}", file=sys.stderr)
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            stack.stop()
        if code not in (0, 130):
            show_logs(stack.log_dir)
        if args.keep_logs:
            print(f"logs kept in {stack.log_dir}")
        else:
            shutil.rmtree(stack.log_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
