"""Benchmark (not a test): what Chorus adds over calling the engine directly.

Starts the simulated engine (vLLM protocol, zero delay) and `chorus up` in front of it, then
prints, over the same conversation:
  - time to first token and total latency, direct vs through Chorus (p50/p99), at concurrency
    1 and 32 (>= 200 requests each);
  - prompt rendering time (the encoder's, reported by the gateway's Server-Timing header);
  - output tokens/s through the whole stack at concurrency 64;
  - resident memory of every service process under that load.

    python bench/bench_latency.py [--requests 200] [--tokens 64] [--throughput-tokens 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


sys.path.insert(0, str(Path(__file__).resolve().parent))
from chorus_stack import Stack, add_shape_argument, chorus_services, rss_mb  # noqa: E402
from stream_clients import pct, prompt_ids  # noqa: E402

MODEL = "openai/gpt-oss-20b"


async def direct_once(http: httpx.AsyncClient, engine: str, ids: list[int]) -> tuple[float, float, int]:
    body = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": 4096,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": [200002, 200012],
    }
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with http.stream("POST", f"{engine}/v1/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("token_ids"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += len(chunk["choices"][0]["token_ids"])
    return ttft or 0.0, time.perf_counter() - t0, tokens


async def chorus_once(http: httpx.AsyncClient, base: str, text: str, timings: list[float]) -> tuple[float, float, int]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
        st = resp.headers.get("server-timing", "")
        for part in st.split(","):
            if part.strip().startswith("render;dur="):
                timings.append(float(part.split("=")[1]))
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices"):
                d = chunk["choices"][0]["delta"]
                if ttft is None and (d.get("reasoning") or d.get("content") or d.get("tool_calls")):
                    ttft = time.perf_counter() - t0
    return ttft or 0.0, time.perf_counter() - t0, tokens


async def run_load(
    fn: Callable[[], Awaitable[tuple[float, float, int]]], n: int, concurrency: int
) -> list[tuple[float, float, int]]:
    sem = asyncio.Semaphore(concurrency)
    results: list[tuple[float, float, int]] = []

    async def one() -> None:
        async with sem:
            results.append(await fn())

    await asyncio.gather(*(one() for _ in range(n)))
    return results


def report(name: str, rows: list[tuple[float, float, int]]) -> dict[str, float]:
    ttft = [r[0] * 1000 for r in rows]
    total = [r[1] * 1000 for r in rows]
    figures = {
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
        "total_p50": pct(total, 50),
        "total_p99": pct(total, 99),
    }
    print(
        f"  {name:<8} TTFT p50 {figures['ttft_p50']:7.2f} ms  p99 {figures['ttft_p99']:7.2f} ms   "
        f"total p50 {figures['total_p50']:7.2f} ms  p99 {figures['total_p99']:7.2f} ms  (n={len(rows)})"
    )
    return figures


async def main(args: argparse.Namespace, stack: Stack) -> None:
    base, engine, log_dir = stack.base, stack.engine, stack.log_dir
    text = f"Benchmark question [[sim:tokens={args.tokens}]]"
    ids = prompt_ids(text)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        render: list[float] = []
        for _ in range(20):  # warm-up
            await direct_once(http, engine, ids)
            await chorus_once(http, base, text, render)
        print(
            f"Chorus benchmark on {os.cpu_count()} cores; simulated engine at zero delay, "
            f"{args.tokens_per_chunk} token(s) per streamed chunk; {args.tokens}-token answers; "
            f"logs in {log_dir}"
        )
        summary = {}
        for conc in (1, 32):
            print(f"concurrency {conc}:")
            d = report("direct", await run_load(lambda: direct_once(http, engine, ids), args.requests, conc))
            render.clear()
            c = report("chorus", await run_load(lambda: chorus_once(http, base, text, render), args.requests, conc))
            added = c["ttft_p50"] - d["ttft_p50"]
            print(
                f"  added by Chorus: TTFT p50 +{added:.2f} ms, total p50 +{c['total_p50'] - d['total_p50']:.2f} ms; "
                f"prompt rendering p50 {statistics.median(render) if render else 0:.3f} ms (included above)"
            )
            summary[conc] = (d, c)
        ttext = f"Throughput run [[sim:tokens={args.throughput_tokens}]]"
        n = args.throughput_requests
        t0 = time.perf_counter()
        peak: dict[str, float] = {}

        async def sample_rss() -> None:
            while True:
                for pid, name in chorus_services(stack.up.pid).items():
                    peak[f"{name}[{pid}]"] = max(peak.get(f"{name}[{pid}]", 0.0), rss_mb(pid))
                await asyncio.sleep(0.5)

        sampler = asyncio.ensure_future(sample_rss())
        rows = await run_load(lambda: chorus_once(http, base, ttext, []), n, 64)
        wall = time.perf_counter() - t0
        sampler.cancel()
        tokens = sum(r[2] for r in rows)
        print(
            f"throughput at concurrency 64: {tokens} output tokens in {wall:.2f} s = "
            f"{tokens / wall:,.0f} tokens/s through the whole stack ({n} requests)"
        )
        print("peak RSS per process under that load:")
        for name, mb in sorted(peak.items()):
            print(f"  {name:<40} {mb:6.1f} MB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--throughput-tokens", type=int, default=2000)
    ap.add_argument("--throughput-requests", type=int, default=128)
    add_shape_argument(ap)
    ap.add_argument(
        "--tokens-per-chunk",
        type=int,
        default=1,
        help="tokens the simulated engine sends per stream chunk (real engines send "
        "one per decode step per request, or more with a stream interval)",
    )
    args = ap.parse_args()
    stack = Stack(Path(tempfile.mkdtemp(prefix="chorus-bench-")))
    try:
        stack.start(args)
        asyncio.run(main(args, stack))
    finally:
        stack.stop()
