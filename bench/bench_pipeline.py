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
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

# bench/ modules (the script's directory is on sys.path)
from chorus_stack import ROOT, Stack, add_shape_argument, chorus_services, cpu_seconds, rss_mb, show_logs
from stream_clients import Load, Result, chat_text, chorus_once, direct_once, pct, prompt_ids, run_load

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


def note_errors(figures: dict[str, Any], run: str, load: Load) -> None:
    """Failed requests are left out of the figures but counted and shown."""
    if not load.errors:
        return
    figures.setdefault("errors", {})[run] = {"count": len(load.errors), "first": load.errors[0]}
    print(f"  WARNING: {len(load.errors)} {run} request(s) failed (left out of the figures); first: {load.errors[0]}")


# ---------------------------------------------------------------------------------- the runs


def latency_figures(rows: list[Result]) -> dict[str, float]:
    ttft = [r.ttft * 1000 for r in rows]
    total = [r.total * 1000 for r in rows]
    return {
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "total_p50_ms": pct(total, 50),
        "total_p99_ms": pct(total, 99),
        "n": len(rows),
    }


async def measure_ttft(
    http: aiohttp.ClientSession,
    stack: Stack,
    args: argparse.Namespace,
    figures: dict[str, Any],
    delay_ms: float = 0.0,
    key: str = "",
) -> None:
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
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            await (direct, chorus)[j].call(calls[j])
    for side, load in (("direct", direct), ("chorus", chorus)):
        missing = sum(1 for r in load.results if not r.ttft)
        if missing or not load.results:
            raise RuntimeError(
                f"{side}: {missing} request(s) had no content token, {len(load.errors)} failed {load.errors[:1]}"
            )
    d, c = latency_figures(direct.results), latency_figures(chorus.results)
    figures[f"{key}ttft"] = {"direct": d, "chorus": c}
    figures[f"{key}added_ttft_p50_ms"] = c["ttft_p50_ms"] - d["ttft_p50_ms"]
    figures[f"{key}added_ttft_p99_ms"] = c["ttft_p99_ms"] - d["ttft_p99_ms"]
    pace = f"engine paced at {delay_ms:g} ms per token" if delay_ms else "engine at zero delay"
    print(
        f"TTFT at concurrency 1, {pace}, {tokens}-token answers, {requests} requests per "
        f"side (alternated, after {WARMUP} warm-up each):"
    )
    for name, f in (("direct", d), ("chorus", c)):
        print(
            f"  {name:<7} TTFT p50 {f['ttft_p50_ms']:7.2f} ms  p99 {f['ttft_p99_ms']:7.2f} ms"
            f"   total p50 {f['total_p50_ms']:7.2f} ms  p99 {f['total_p99_ms']:7.2f} ms"
        )
    print(
        f"  added   TTFT p50 {figures[f'{key}added_ttft_p50_ms']:+7.2f} ms  "
        f"p99 {figures[f'{key}added_ttft_p99_ms']:+7.2f} ms"
    )
    note_errors(figures, f"{key}ttft direct", direct)
    note_errors(figures, f"{key}ttft chorus", chorus)


async def measure_throughput(
    http: aiohttp.ClientSession, stack: Stack, args: argparse.Namespace, figures: dict[str, Any]
) -> None:
    text = chat_text(args.throughput_tokens)
    ids = prompt_ids(text)
    n, conc = args.throughput_requests, args.concurrency
    print(
        f"throughput at concurrency {conc}: {n} requests of ~{args.throughput_tokens} tokens, "
        f"{args.tokens_per_chunk} token(s) per engine event:"
    )

    sim_cpu0, client_cpu0 = cpu_seconds(stack.sim.pid), time.process_time()
    t0 = time.perf_counter()
    direct = await run_load(lambda: direct_once(http, stack.engine, ids), n, conc)
    direct_wall = time.perf_counter() - t0
    direct_sim_cpu = cpu_seconds(stack.sim.pid) - sim_cpu0
    direct_client_cpu = time.process_time() - client_cpu0
    direct_tokens = sum(r.tokens for r in direct.results)
    if direct_tokens != sum(r.usage_tokens for r in direct.results):
        print(f"  WARNING: direct ids received {direct_tokens} != usage {sum(r.usage_tokens for r in direct.results)}")
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
        "direct": {
            "tokens": direct_tokens,
            "wall_s": direct_wall,
            "tokens_per_s": direct_tps,
            "engine_cpu_us_per_token": direct_sim_cpu / direct_tokens * 1e6,
            "client_cpu_us_per_token": direct_client_cpu / direct_tokens * 1e6,
        },
        "chorus": {
            "tokens": chorus_tokens,
            "wall_s": chorus_wall,
            "tokens_per_s": chorus_tps,
            "engine_cpu_us_per_token": chorus_sim_cpu / chorus_tokens * 1e6,
            "client_cpu_us_per_token": chorus_client_cpu / chorus_tokens * 1e6,
        },
    }
    figures["direct_tokens_per_s"] = direct_tps
    figures["chorus_tokens_per_s"] = chorus_tps
    figures["throughput_ratio"] = chorus_tps / direct_tps
    figures["cpu_s"] = total_cpu
    figures["cpu_us_per_token"] = total_cpu / chorus_tokens * 1e6
    # the machine's speed drifts (a shared VM): the same run's engine cost per token, as a yardstick
    figures["cpu_per_token_vs_engine"] = figures["cpu_us_per_token"] / (direct_sim_cpu / direct_tokens * 1e6)
    figures["cpu_us_per_token_by_service"] = {services[pid]: v / chorus_tokens * 1e6 for pid, v in cpu.items()}
    figures["peak_rss_mb_by_service"] = {services[pid]: mb for pid, mb in peak.items()}
    figures["peak_rss_mb"] = max(peak.values())

    for name, tokens, wall, tps, eng, client in (
        ("direct", direct_tokens, direct_wall, direct_tps, direct_sim_cpu, direct_client_cpu),
        ("chorus", chorus_tokens, chorus_wall, chorus_tps, chorus_sim_cpu, chorus_client_cpu),
    ):
        print(
            f"  {name:<7} {tokens:>8} tokens in {wall:7.2f} s = {tps:>9,.0f} tokens/s"
            f"   (CPU per token: engine {eng / tokens * 1e6:5.1f} us, "
            f"benchmark client {client / tokens * 1e6:5.1f} us)"
        )
    print(f"  ratio chorus/direct {figures['throughput_ratio']:.3f}x")
    note_errors(figures, "throughput direct", direct)
    note_errors(figures, "throughput chorus", chorus)
    print(f"  Chorus service CPU over the chorus run: {total_cpu:.2f} s = {figures['cpu_us_per_token']:.1f} us/token")
    print(f"  {'service':<20} {'pid':>7} {'CPU s':>8} {'us/token':>9} {'peak RSS':>10}")
    for pid, name in sorted(services.items(), key=lambda kv: kv[1]):
        print(f"  {name:<20} {pid:>7} {cpu[pid]:8.2f} {cpu[pid] / chorus_tokens * 1e6:9.1f} {peak[pid]:7.1f} MB")


def print_summary(figures: dict[str, Any]) -> None:
    errors: dict[str, dict[str, Any]] = figures.get("errors", {})
    figures["failed_requests"] = sum(e["count"] for e in errors.values())
    shown = {
        "added_ttft_p50_ms": (f"{figures['added_ttft_p50_ms']:+.2f} ms (p99 {figures['added_ttft_p99_ms']:+.2f} ms)"),
        "paced_added_ttft_p50_ms": (
            f"{figures['paced_added_ttft_p50_ms']:+.2f} ms "
            f"(p99 {figures['paced_added_ttft_p99_ms']:+.2f} ms, "
            f"{figures['config']['paced_ms']:g} ms/token)"
        ),
        "throughput_ratio": (
            f"{figures['throughput_ratio']:.3f}x "
            f"({figures['chorus_tokens_per_s']:,.0f} / "
            f"{figures['direct_tokens_per_s']:,.0f} tokens/s)"
        ),
        "cpu_us_per_token": (
            f"{figures['cpu_us_per_token']:.1f} us ({figures['cpu_per_token_vs_engine']:.2f}x the engine's own)"
        ),
        "peak_rss_mb": (
            f"{figures['peak_rss_mb']:.1f} MB ("
            + max(figures["peak_rss_mb_by_service"].items(), key=lambda kv: kv[1])[0]
            + ")"
        ),
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
        print(f"WARNING: {err['count']} {run} request(s) failed and are not in the figures; first: {err['first']}")


async def run(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "keep_logs")},
        "cores": os.cpu_count(),
    }
    print(
        f"Chorus pipeline benchmark on {os.cpu_count()} cores: simulated engine (vLLM, zero "
        f"delay, {args.tokens_per_chunk} token(s) per event) at {stack.engine}, Chorus at "
        f"{stack.base} ({'split: encoder, dispatcher, parsers' if args.up_args else 'workers'}); code under {ROOT}"
    )
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
    ap.add_argument(
        "--paced-ms",
        type=float,
        default=5.0,
        help="the paced TTFT run's engine decode step per token (a real engine's pace)",
    )
    ap.add_argument("--throughput-tokens", type=int, default=2000)
    ap.add_argument("--throughput-requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--tokens-per-chunk", type=int, default=1, help="tokens the simulated engine sends per stream event"
    )
    add_shape_argument(ap)
    ap.add_argument("--quick", action="store_true", help="smoke run: 30 requests, 20 throughput requests of 500 tokens")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    ap.add_argument("--keep-logs", action="store_true", help="keep the services' log directory")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.throughput_requests, args.throughput_tokens = 30, 20, 500
    return args


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
