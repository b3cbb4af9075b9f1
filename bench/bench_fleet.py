"""Benchmark (not a test): prefix-cache-aware routing over a fleet of simulated engines.

Four simulated engines with prefix caches (18k tokens each, 16-token blocks, prefill 40 us per
uncached prompt token, one prefill at a time), 16 agent-like conversations of 5 turns (shared
1,200-word instructions, a 3,000-word document of their own, one question per turn, short
answers; 4 of them through the Responses API chained by `previous_response_id`, the others
Chat Completions re-sending the whole history), 8 conversations at a time. For each routing
mode in turn, fresh engines (empty caches) and a fresh `chorus up` in front of them:

- round_robin (the baseline), cache_aware with the engines' KV cache events, cache_aware
  without them (the index of what the stack sent, with the engines' capacity), least_load.

Per mode: of the prompt tokens an ideal router could have found cached (each request's longest
prefix, in whole blocks, shared with any earlier request's prompt: unbounded caches), the
fraction the engines found ("reuse of the ideal"); client TTFT p50/p95 (first reasoning or
content delta of the stream); requests per engine; failures; beside the targets.

The script runs the modes; the fleet and the workload are in fleet_workload.py, the client in
fleet_client.py, the figures and the report in fleet_figures.py.

    python bench/bench_fleet.py [--quick] [--modes MODE ...] [--json PATH] [--keep-logs]
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chorus_stack import ROOT, Fleet, show_logs
from fleet_client import drive
from fleet_figures import engine_records, ideal_cached, report, summarise, targets
from fleet_workload import BLOCK, ENGINE_SETTINGS, ENGINES, QUICK, Conversation, Workload, build

# what tests/bench/test_bench_fleet.py imports from the script
__all__ = ["MODES", "QUICK", "ideal_cached", "main"]


@dataclass(frozen=True)
class Mode:
    label: str
    routing: str  # chorus up --routing
    events: bool  # engine specs with kv_events / kv_replay


MODES = {
    "round_robin": Mode("round robin", "round_robin", False),
    "cache_aware_events": Mode("cache_aware, KV events", "cache_aware", True),
    "cache_aware_approx": Mode("cache_aware, no events", "cache_aware", False),
    "least_load": Mode("least_load", "least_load", False),
}


def engine_settings(args: argparse.Namespace) -> dict[str, str]:
    return {**ENGINE_SETTINGS, "CHORUS_SIM_PREFILL_US_PER_TOKEN": f"{args.prefill_us:g}"}


def run_mode(
    name: str, args: argparse.Namespace, instructions: str, conversations: list[Conversation]
) -> dict[str, Any]:
    mode = MODES[name]
    fleet = Fleet(Path(tempfile.mkdtemp(prefix=f"chorus-bench-fleet-{name}-")))
    failed = True
    try:
        fleet.start_engines(ENGINES, engine_settings(args))
        specs = []
        for e in fleet.engines:
            if mode.events:
                specs.append(f"sim={e.url},kv_events={e.kv_events},kv_replay={e.kv_replay}")
            elif mode.routing == "cache_aware" and args.approx_capacity:
                specs.append(f"sim={e.url},capacity={args.approx_capacity}")
            else:
                specs.append(f"sim={e.url}")
        fleet.start_up(specs, ["--routing", mode.routing])
        t = time.perf_counter()
        samples = asyncio.run(drive(fleet.base, name, instructions, conversations, args.workload))
        wall = time.perf_counter() - t
        figures = summarise(samples, engine_records(fleet.engines), args.workload)
        failed = bool(figures["failures"])
        return {"mode": name, "label": mode.label, "wall_s": wall, **figures, "samples": [asdict(s) for s in samples]}
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            fleet.stop()
        if failed:
            show_logs(fleet.log_dir)
        if args.keep_logs:
            print(f"{name}: logs kept in {fleet.log_dir}")
        else:
            shutil.rmtree(fleet.log_dir, ignore_errors=True)


def routing_decision_time() -> str:
    """The prefix index's match of a 256-block chain, from bench/bench_routing.py (about 1 s)."""
    cmd = [sys.executable, str(ROOT / "bench" / "bench_routing.py"), "--blocks", "20000", "--rounds", "300"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout
    lines = [line for line in out.splitlines() if line.startswith(("match, 256", "cached_tokens"))]
    return "; ".join(" ".join(line.split()) for line in lines) or "see python bench/bench_routing.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="the routing modes to run")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 short conversations of 2 turns, 2 at a time")
    ap.add_argument(
        "--approx-capacity",
        type=int,
        default=int(ENGINE_SETTINGS["CHORUS_SIM_KV_CACHE_TOKENS"]),
        help="capacity= in the specs of cache_aware without events (0: none, the stack's default)",
    )
    ap.add_argument(
        "--prefill-us",
        type=float,
        default=float(ENGINE_SETTINGS["CHORUS_SIM_PREFILL_US_PER_TOKEN"]),
        help="the engines' prefill cost per uncached prompt token (0: what is left is Chorus's and the machine's)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the figures (and every request) as JSON to PATH")
    ap.add_argument("--keep-logs", action="store_true", help="keep each mode's log directory")
    args = ap.parse_args(argv)
    args.workload = QUICK if args.quick else Workload()
    return args


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # clean up on SIGTERM as on Ctrl-C
    wl: Workload = args.workload
    instructions, conversations = build(wl)
    print(
        f"Chorus fleet benchmark on {os.cpu_count()} cores: {ENGINES} simulated engines "
        f"({ENGINE_SETTINGS['CHORUS_SIM_KV_CACHE_TOKENS']}-token prefix caches, {BLOCK}-token blocks, prefill "
        f"{args.prefill_us:g} us per uncached token), {wl.conversations} "
        f"conversations of {wl.turns} turns ({wl.responses} through Responses), {wl.concurrency} at a time; "
        f"fresh engines and `chorus up` per mode; code under {ROOT}"
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in args.modes:
            print(f"{name}: running ...", flush=True)
            results[name] = run_mode(name, args, instructions, conversations)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (TimeoutError, RuntimeError, OSError, aiohttp.ClientError) as exc:
        print(f"benchmark failed: {exc!r}", file=sys.stderr)
        return 1
    report(results)
    decision = "" if args.quick else routing_decision_time()
    if decision:
        print(f"\nrouting decision (bench/bench_routing.py, 20k-block index): {decision}")
    if args.json:
        config = {**asdict(wl), "engines": ENGINES, "engine_settings": engine_settings(args)}
        config["approx_capacity"] = args.approx_capacity
        out = {"config": config, "modes": results, "targets": targets(results), "routing_decision": decision}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 1 if any(r["failures"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
