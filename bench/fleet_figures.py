"""The fleet benchmark's figures (bench_fleet.py): which engine served each request and with
which prompt (the engines' own records), the prompt tokens an ideal router could have found
cached, each mode's reuse of that ideal, TTFT and balance, and the report printed beside the
targets."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

# bench/ modules (the script's directory is on sys.path; chorus_stack puts the repository on it)
from chorus_stack import SimEngine
from fleet_client import Sample
from fleet_workload import BLOCK, ENGINES, Workload
from stream_clients import pct

from services.dispatcher.routing import chain_hashes

REUSE_TARGET = {"cache_aware_events": 0.9, "cache_aware_approx": 0.8}
TTFT_RATIO_TARGET = 0.35  # p50 against round robin's
BALANCE_TARGET = 1.5  # busiest engine's requests against the mean


def engine_records(engines: list[SimEngine]) -> dict[str, tuple[int, list[int]]]:
    """Request id -> (engine index, prompt token ids), from every engine's /sim/requests; a
    resumed attempt (``ID.turn.attempt``) counts under its request's id, the latest kept."""
    seen: dict[str, tuple[int, list[int]]] = {}
    for i, engine in enumerate(engines):
        with urllib.request.urlopen(f"{engine.url}/sim/requests", timeout=30) as r:
            for record in json.load(r):
                seen[record["request_id"].split(".")[0]] = (i, record["prompt_token_ids"])
    return seen


def ideal_cached(prompts: list[list[int]]) -> list[int]:
    """Per prompt, in order: the longest prefix in whole blocks it shares with any earlier one
    (at most all but its last token, which an engine always computes)."""
    seen: set[int] = set()
    out = []
    for ids in prompts:
        chain = chain_hashes(ids, BLOCK)
        limit, n = min(len(chain), max(0, len(ids) - 1) // BLOCK), 0
        while n < limit and chain[n] in seen:
            n += 1
        out.append(n * BLOCK)
        seen.update(chain)
    return out


def summarise(samples: list[Sample], records: dict[str, tuple[int, list[int]]], wl: Workload) -> dict[str, Any]:
    ordered = sorted((s for s in samples if s.api_id in records), key=lambda s: s.sent)
    for s in ordered:
        s.engine = records[s.api_id][0]
    for s, ideal in zip(ordered, ideal_cached([records[s.api_id][1] for s in ordered]), strict=True):
        s.ideal = ideal
    ok = [s for s in samples if not s.error]
    for s in ok:
        if s.engine < 0:
            s.error = f"no engine saw request {s.api_id or '(no id)'}"
    ok = [s for s in ok if not s.error]
    per_engine = [sum(1 for s in ok if s.engine == i) for i in range(ENGINES)]
    found, ideal = sum(s.cached_tokens for s in ok), sum(s.ideal for s in ok)
    ttfts = [s.ttft * 1000 for s in ok if s.ttft]
    mean = sum(per_engine) / ENGINES
    placement: dict[str, str] = {}
    for s in sorted(samples, key=lambda s: (s.conversation, s.turn)):
        key = f"c{s.conversation:02d}{'r' if s.api == 'responses' else ''}"
        placement[key] = placement.get(key, "") + (str(s.engine) if s.engine >= 0 and not s.error else "x")
    return {
        "requests": len(ok),
        "expected": wl.conversations * wl.turns,
        "failures": [f"{s.request_id}: {s.error}" for s in samples if s.error],
        "reuse": found / ideal if ideal else 0.0,
        "found_cached_tokens": found,
        "ideal_cached_tokens": ideal,
        "prompt_tokens": sum(s.prompt_tokens for s in ok),
        "ttft_p50_ms": pct(ttfts, 50),
        "ttft_p95_ms": pct(ttfts, 95),
        "per_engine": per_engine,
        "busiest_over_mean": max(per_engine) / mean if mean else 0.0,
        "placement": placement,
    }


def targets(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    """(mode, target, measured, met) for every target a measured mode has."""
    rows = []
    base = results.get("round_robin")
    for name, r in results.items():
        if name in REUSE_TARGET:
            rows.append((name, f"reuse >= {REUSE_TARGET[name]}", f"{r['reuse']:.3f}", r["reuse"] >= REUSE_TARGET[name]))
        if not name.startswith("cache_aware"):
            continue
        if base and base["ttft_p50_ms"]:
            ratio = r["ttft_p50_ms"] / base["ttft_p50_ms"]
            rows.append(
                (name, f"TTFT p50 <= {TTFT_RATIO_TARGET}x round robin's", f"{ratio:.2f}x", ratio <= TTFT_RATIO_TARGET)
            )
        balance = r["busiest_over_mean"]
        rows.append((name, f"busiest engine <= {BALANCE_TARGET}x mean", f"{balance:.2f}x", balance <= BALANCE_TARGET))
    return rows


def report(results: dict[str, dict[str, Any]]) -> None:
    base = results.get("round_robin")
    print()
    head = f"| {'mode':<24} | {'reuse of the ideal':<18} | {'TTFT p50 ms':>11} | {'TTFT p95 ms':>11} | {'p50 / RR':>8} | {'requests per engine':<19} | {'busiest/mean':>12} | {'failures':>8} |"
    print(head)
    print("|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|")
    for r in results.values():
        ratio = f"{r['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}x" if base and base["ttft_p50_ms"] else "-"
        engines = " ".join(str(n) for n in r["per_engine"])
        print(
            f"| {r['label']:<24} | {r['reuse']:<18.3f} | {r['ttft_p50_ms']:>11.0f} | {r['ttft_p95_ms']:>11.0f} | "
            f"{ratio:>8} | {engines:<19} | {r['busiest_over_mean']:>11.2f}x | {len(r['failures']):>8} |"
        )
    print()
    for r in results.values():
        print(
            f"{r['label']}: {r['requests']}/{r['expected']} requests in {r['wall_s']:.1f} s; cached tokens found "
            f"{r['found_cached_tokens']:,} of ideal {r['ideal_cached_tokens']:,} (prompt tokens {r['prompt_tokens']:,})"
        )
        cells = [f"{k}={v}" for k, v in r["placement"].items()]
        for i in range(0, len(cells), 8):
            print(("  engine per turn: " if i == 0 else "                   ") + "  ".join(cells[i : i + 8]))
        for failure in r["failures"][:3]:
            print(f"  FAILED {failure}")
    rows = targets(results)
    if rows:
        print()
        print(f"| {'mode':<20} | {'target':<34} | {'measured':>8} |        |")
        print(f"|{'-' * 22}|{'-' * 36}|{'-' * 10}|{'-' * 8}|")
        for name, target, measured, met in rows:
            print(f"| {name:<20} | {target:<34} | {measured:>8} | {'met' if met else 'MISSED':<6} |")
