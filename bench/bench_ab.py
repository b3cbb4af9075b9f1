"""Benchmark (not a test): the added time to first token of two code trees, paired.

    git worktree add /tmp/before HEAD~1
    python bench/bench_ab.py /tmp/before . [--requests 150] [--rounds 2]

Starts the simulated engine and `chorus up` from each tree (one stack per tree, both idle but
for the request being measured), then alternates single requests at concurrency 1 between the
engine called directly and each stack, in every order in turn, at zero engine delay and
paced like a real engine. Prints each tree's added TTFT p50 per round. On a shared machine whose
speed drifts by a millisecond from one run of ``bench_pipeline.py`` to the next, this is what
shows a change of a few tenths of a millisecond (the same code against itself: within 0.2 ms a
round): both trees are measured in the same minutes."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

# bench/ modules (the script's directory is on sys.path)
from chorus_stack import Stack
from stream_clients import Result, chat_text, chorus_once, direct_once, prompt_ids

WARMUP = 20
# The order of the three sides (0: the engine called directly, 1 and 2: the trees) in each
# iteration, cyclically: every order once, arranged so that each tree follows the direct call
# three times in six, the other tree twice and itself once. What a request follows moves its
# time to first token by 0.1-0.2 ms (a rotation, in which the first tree followed the direct
# call twice as often as the second, measured the same code 0.18 ms apart).
ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1))


def through(http: aiohttp.ClientSession, base: str, text: str) -> Callable[[], Awaitable[Result]]:
    return lambda: chorus_once(http, base, text)


async def paired(
    http: aiohttp.ClientSession, stacks: dict[str, Stack], delay_ms: float, requests: int
) -> dict[str, float]:
    """Added TTFT p50 of each tree (ms) over ``requests`` requests a side (rounded up to whole
    cycles of ``ORDERS``)."""
    text = chat_text(4 if delay_ms else 64, delay_ms)
    ids = prompt_ids(text)
    engine = next(iter(stacks.values())).engine
    calls: list[tuple[str, Callable[[], Awaitable[Result]]]] = [("direct", lambda: direct_once(http, engine, ids))]
    calls += [(name, through(http, stack.base, text)) for name, stack in stacks.items()]
    for _ in range(WARMUP):
        for _, call in calls:
            await call()
    ttft: dict[str, list[float]] = {name: [] for name, _ in calls}
    cycles = -(-requests // len(ORDERS))  # whole cycles of the order
    for i in range(cycles * len(ORDERS)):
        for j in ORDERS[i % len(ORDERS)]:
            name, call = calls[j]
            ttft[name].append((await call()).ttft * 1000)
    direct = statistics.median(ttft["direct"])
    return {name: statistics.median(ttft[name]) - direct for name in stacks}


async def measure(args: argparse.Namespace, stacks: dict[str, Stack]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for round_ in range(1, args.rounds + 1):
            for delay_ms, requests in ((0.0, args.requests), (args.paced_ms, max(10, args.requests // 2))):
                added = await paired(http, stacks, delay_ms, requests)
                pace = f"paced {delay_ms:g} ms/token" if delay_ms else "zero delay"
                figures = "   ".join(f"{name} {value:+.2f} ms" for name, value in added.items())
                print(f"round {round_}, {pace:<20} added TTFT p50:   {figures}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs=2, type=Path, help="two checkouts of Chorus (e.g. git worktrees)")
    ap.add_argument("--requests", type=int, default=150, help="requests per side and round at zero delay")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paced-ms", type=float, default=5.0)
    args = ap.parse_args(argv)
    options = argparse.Namespace(tokens_per_chunk=1, up_args=[])
    stacks: dict[str, Stack] = {}
    try:
        for tree in args.trees:
            name = f"{tree.resolve().name}{'' if tree.resolve().name not in stacks else '-2'}"
            stack = stacks[name] = Stack(Path(tempfile.mkdtemp(prefix="chorus-bench-ab-")), root=tree.resolve())
            stack.start(options)
        asyncio.run(measure(args, stacks))
    finally:
        for stack in stacks.values():
            stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
