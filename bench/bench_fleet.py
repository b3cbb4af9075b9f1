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

    python bench/bench_fleet.py [--quick] [--modes MODE ...] [--json PATH] [--keep-logs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chorus_stack import ROOT, Fleet, SimEngine, show_logs
from stream_clients import MODEL, RequestFailed, check_status, pct, sse_data

from services.dispatcher.routing import chain_hashes

ENGINES = 4
BLOCK = 16
ENGINE_SETTINGS = {
    "CHORUS_SIM_KV_CACHE_TOKENS": "18000",
    "CHORUS_SIM_KV_BLOCK_SIZE": str(BLOCK),
    "CHORUS_SIM_PREFILL_US_PER_TOKEN": "40",
    "CHORUS_SIM_TOKEN_DELAY_MS": "0",
}
REUSE_TARGET = {"cache_aware_events": 0.9, "cache_aware_approx": 0.8}
TTFT_RATIO_TARGET = 0.35  # p50 against round robin's
BALANCE_TARGET = 1.5  # busiest engine's requests against the mean


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

VOCABULARY = """
    the of and to in is that for it as with was on be by this are from at or an which have not
    has but were all their can more one its also other into new these than time some two only
    may such first most over used many any well when would each both between through system
    data model value point state case work part place year group number order process result
    level form rate report record field table policy market record service method design plan
    power energy water light sound heat force signal network engine cache block token request
    answer question document section chapter figure source river mountain forest city road
    bridge garden window market harbor island valley station library museum letter account
    budget contract survey sample measure pattern surface volume weight length width depth
    early late large small long short high low open close strong weak clear simple common
    general special local global public private direct final total average major minor
"""
WORDS = tuple(VOCABULARY.split())


@dataclass(frozen=True)
class Workload:
    conversations: int = 16
    turns: int = 5
    responses: int = 4  # of the conversations, through the Responses API
    concurrency: int = 8
    instruction_words: int = 1200
    document_words: int = 3000
    answer_tokens: int = 40
    seed: int = 20261128


QUICK = Workload(conversations=4, turns=2, responses=1, concurrency=2, instruction_words=200, document_words=500)


def prose(rng: random.Random, words: int) -> str:
    """``words`` words of seeded prose: sentences of 6-18 words, paragraphs of 5 sentences."""
    sentences, n = [], 0
    while n < words:
        k = min(rng.randint(6, 18), words - n)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    return "\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5))


@dataclass(frozen=True)
class Conversation:
    index: int
    api: str  # chat | responses
    first_message: str  # the document and the first question
    questions: tuple[str, ...]  # the later turns'


def build(wl: Workload) -> tuple[str, list[Conversation]]:
    """The shared instructions and the conversations, the same for every mode."""
    rng = random.Random(wl.seed)
    instructions = "You are a careful analyst. Follow these instructions.\n\n" + prose(rng, wl.instruction_words)
    n, r = wl.conversations, wl.responses
    via_responses = {round((k + 1) * n / r) - 1 for k in range(r)} if r else set()
    conversations = []
    for i in range(n):
        doc = prose(random.Random(wl.seed * 1000 + i), wl.document_words)
        qs = [
            f"Question {t + 1}: what does the document say about {rng.choice(WORDS)} and {rng.choice(WORDS)}, "
            f"and how does it bear on {rng.choice(WORDS)}? Answer briefly. [[sim:tokens={wl.answer_tokens}]]"
            for t in range(wl.turns)
        ]
        first = f"Here is document {i}.\n\n{doc}\n\n{qs[0]}"
        conversations.append(Conversation(i, "responses" if i in via_responses else "chat", first, tuple(qs[1:])))
    return instructions, conversations


# ------------------------------------------------------------------------------------ the client


@dataclass
class Sample:
    """One request: what the client saw, and (after the run) what the engines saw."""

    conversation: int
    turn: int
    api: str
    request_id: str  # ours (x-request-id)
    api_id: str = ""  # the completion's or response's id: the request id the engine sees
    sent: float = 0.0  # seconds since the mode's run started
    ttft: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # as the engine reported it (usage)
    engine: int = -1  # which engine served it (its /sim/requests)
    ideal: int = 0
    error: str = ""


TEXT_DELTAS = {"response.output_text.delta", "response.reasoning_text.delta", "response.reasoning_summary_text.delta"}


async def chat_turn(http: aiohttp.ClientSession, base: str, messages: list[dict[str, str]], s: Sample) -> str:
    """One streamed chat completion; the answer's content."""
    body = {"model": MODEL, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    content: list[str] = []
    usage: dict[str, Any] | None = None
    async with http.post(f"{base}/v1/chat/completions", json=body, headers={"x-request-id": s.request_id}) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            chunk = json.loads(raw[6:])
            s.api_id = s.api_id or chunk.get("id", "")
            if chunk.get("error"):
                raise RequestFailed(f"chorus error: {chunk['error']}")
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if not s.ttft and (delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")):
                    s.ttft = time.perf_counter() - t0
                content.append(delta.get("content") or "")
            usage = chunk.get("usage") or usage
    if usage is None:
        raise RequestFailed("the stream ended without its usage chunk")
    s.prompt_tokens = usage["prompt_tokens"]
    s.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return "".join(content)


async def responses_turn(
    http: aiohttp.ClientSession, base: str, instructions: str, text: str, previous: str | None, s: Sample
) -> str:
    """One streamed, stored response continuing ``previous``; its id."""
    body: dict[str, Any] = {"model": MODEL, "instructions": instructions, "input": text, "store": True, "stream": True}
    if previous:
        body["previous_response_id"] = previous
    t0 = time.perf_counter()
    done: dict[str, Any] | None = None
    async with http.post(f"{base}/v1/responses", json=body, headers={"x-request-id": s.request_id}) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            event = json.loads(raw[6:])
            kind = event.get("type", "")
            if kind == "response.created":
                s.api_id = event["response"]["id"]
            if not s.ttft and kind in TEXT_DELTAS and event.get("delta"):
                s.ttft = time.perf_counter() - t0
            elif kind == "response.completed":
                done = event["response"]
            elif kind in ("error", "response.failed", "response.incomplete"):
                raise RequestFailed(f"{kind}: {json.dumps(event)[:300]}")
    if done is None or not done.get("usage"):
        raise RequestFailed("the stream ended without response.completed and its usage")
    s.prompt_tokens = done["usage"]["input_tokens"]
    s.cached_tokens = (done["usage"].get("input_tokens_details") or {}).get("cached_tokens") or 0
    return str(done["id"])


async def converse(
    http: aiohttp.ClientSession, base: str, tag: str, instructions: str, conv: Conversation, t_start: float
) -> list[Sample]:
    """The conversation's turns in order; stops at a failed turn (the next needs its answer)."""
    samples: list[Sample] = []
    history = [{"role": "system", "content": instructions}]
    previous: str | None = None
    for turn, text in enumerate((conv.first_message, *conv.questions)):
        s = Sample(conv.index, turn, conv.api, f"fleet-{tag}-c{conv.index:02d}-t{turn}")
        samples.append(s)
        s.sent = time.perf_counter() - t_start
        try:
            if conv.api == "chat":
                history.append({"role": "user", "content": text})
                history.append({"role": "assistant", "content": await chat_turn(http, base, history, s)})
            else:
                previous = await responses_turn(http, base, instructions, text, previous, s)
        except (RequestFailed, aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            s.error = f"{type(exc).__name__}: {exc}"
            break
    return samples


async def drive(
    base: str, tag: str, instructions: str, conversations: list[Conversation], wl: Workload
) -> list[Sample]:
    """Every conversation, ``wl.concurrency`` at a time (each holds its place for all its turns)."""
    sem = asyncio.Semaphore(wl.concurrency)
    t_start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:

        async def one(conv: Conversation) -> list[Sample]:
            async with sem:
                return await converse(http, base, tag, instructions, conv, t_start)

        runs = await asyncio.gather(*(one(c) for c in conversations))
    return [s for run in runs for s in run]


# ------------------------------------------------------------------------------------ the figures


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


# ------------------------------------------------------------------------------------ the report


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
