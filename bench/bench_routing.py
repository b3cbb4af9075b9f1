"""Benchmark (not a test): the prefix index and chain hashing of services/dispatcher/routing.

    python bench/bench_routing.py [--blocks 100000] [--engines 8] [--rounds 2000]

Builds an index of ``--blocks`` distinct 16-token blocks over ``--engines`` engines (half fed by
KV events, half by record_sent), as 256-block prompts that share system prompts of 64 blocks,
then times ``match`` of a 256-block chain that several engines hold in full (the worst case: the
walk never stops early), ``cached_tokens`` of the same, and ``chain_hashes`` per 1k tokens (with
the variants it was chosen from). Best and median of ``--rounds`` are printed beside the targets."""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.kv_events import BlockStored
from services.dispatcher.routing import PrefixIndex, chain_hashes

BLOCK = 16
PROMPT_BLOCKS = 256
MATCH_TARGET_US = 100.0
HASH_TARGET_US_PER_BLOCK = 0.3


def timed(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Best and median seconds of ``rounds`` calls."""
    runs = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return min(runs), statistics.median(runs)


def line(label: str, best: float, median: float, note: str = "") -> None:
    print(f"{label:34s} best {best * 1e6:6.1f} us, median {median * 1e6:6.1f} us{note}")


def build(n_blocks: int, n_engines: int, rng: random.Random) -> tuple[PrefixIndex, list[int], list[int]]:
    index = PrefixIndex(capacity=n_blocks)
    engines = [f"engine-{i}" for i in range(n_engines)]
    systems = [[rng.randrange(200_000) for _ in range(64 * BLOCK)] for _ in range(8)]
    prompt: list[int] = []
    while len(index) < n_blocks:  # the number of distinct blocks indexed
        prompt = rng.choice(systems) + [rng.randrange(200_000) for _ in range((PROMPT_BLOCKS - 64) * BLOCK)]
        chain = chain_hashes(prompt, BLOCK)
        for engine in rng.sample(engines, 3):
            if int(engine.rsplit("-", 1)[1]) % 2:
                index.record_sent(engine, chain)
            else:  # as the engine would say it: its own hashes, in two events
                keys = [h ^ 0x5A5A for h in chain]
                half = PROMPT_BLOCKS // 2
                index.apply(engine, BlockStored(tuple(keys[:half]), None, tuple(prompt[: half * BLOCK]), BLOCK))
                index.apply(
                    engine, BlockStored(tuple(keys[half:]), keys[half - 1], tuple(prompt[half * BLOCK :]), BLOCK)
                )
    return index, prompt, chain_hashes(prompt, BLOCK)


def hash_variants(ids: list[int]) -> dict[str, Callable[[], object]]:
    """The chain hash as shipped, and the variants it was chosen from (same chain structure)."""
    width = 4 * BLOCK
    n = len(ids) // BLOCK

    def fresh() -> list[bytes]:
        data, prev, out = array("I", ids).tobytes(), b"\0" * 8, []
        for i in range(0, n * width, width):
            prev = hashlib.blake2b(prev + data[i : i + width], digest_size=8).digest()
            out.append(prev)
        return out

    def running_copy() -> list[bytes]:  # a hash of the whole prefix; cannot start from a parent's hash
        data, h, out = array("I", ids).tobytes(), hashlib.blake2b(digest_size=8), []
        for i in range(0, n * width, width):
            h.update(data[i : i + width])
            out.append(h.copy().digest())
        return out

    def md5() -> list[bytes]:
        data, prev, out = array("I", ids).tobytes(), b"\0" * 8, []
        for i in range(0, n * width, width):
            prev = hashlib.md5(prev + data[i : i + width]).digest()[:8]
            out.append(prev)
        return out

    def tuple_hash() -> list[int]:  # fast, but CPython's tuple hash is not a stable format
        prev, out = 0, []
        for i in range(0, n * BLOCK, BLOCK):
            prev = hash((prev, *ids[i : i + BLOCK]))
            out.append(prev)
        return out

    return {
        "chain_hashes (shipped: copied blake2b template)": lambda: chain_hashes(ids, BLOCK),
        "blake2b(prev + block) per block": fresh,
        "one blake2b, .copy().digest() per block": running_copy,
        "md5(prev + block)": md5,
        "tuple hash() (not stable across Pythons)": tuple_hash,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    rng = random.Random(7)

    t = time.perf_counter()
    index, prompt, chain = build(args.blocks, args.engines, rng)
    built = time.perf_counter() - t
    held = sum(index.size(e) for e in index.engines())
    print(
        f"index: {len(index):,} distinct blocks, {held:,} held over {args.engines} engines "
        f"(built in {built:.1f} s, events and record_sent)"
    )
    full = index.match(chain)
    whole = sorted(e for e, n in full.items() if n == PROMPT_BLOCKS)
    assert len(whole) == 3, full
    print(
        f"the probe chain: {PROMPT_BLOCKS} blocks, held in full by {whole}, its system prompt by {len(full) - 3} more"
    )

    best, med = timed(lambda: index.match(chain), args.rounds)
    line(f"match, {PROMPT_BLOCKS}-block chain", best, med, f"  (target < {MATCH_TARGET_US:.0f} us)")
    chains = {BLOCK: chain}
    best, med = timed(lambda: index.cached_tokens(chains), args.rounds)
    line("cached_tokens, same chain", best, med)
    miss = chain_hashes([rng.randrange(200_000) for _ in range(PROMPT_BLOCKS * BLOCK)], BLOCK)
    best, med = timed(lambda: index.match(miss), args.rounds)
    line("match, a chain nobody holds", best, med)
    sent = PrefixIndex()
    best, med = timed(lambda: sent.record_sent("e", chain), max(args.rounds // 4, 1))
    line(f"record_sent, {PROMPT_BLOCKS} blocks (refresh)", best, med)

    ids = prompt[: 1024 * (len(prompt) // 1024)]
    per_1k = len(ids) / 1024
    print(
        f"\nchain hashing, {BLOCK}-token blocks, per 1k tokens ({1024 // BLOCK} blocks); target {HASH_TARGET_US_PER_BLOCK} us/block:"
    )
    for name, fn in hash_variants(ids).items():
        best, med = timed(fn, max(args.rounds // 10, 20))
        print(
            f"  {name:48s} best {best / per_1k * 1e6:6.1f} us/1k tokens = {best / (len(ids) / BLOCK) * 1e6:.3f} us/block (median {med / (len(ids) / BLOCK) * 1e6:.3f})"
        )

    events = [
        BlockStored((i,), i - 1 if i else None, tuple(prompt[i * BLOCK : (i + 1) * BLOCK]), BLOCK)
        for i in range(PROMPT_BLOCKS)
    ]

    def apply_all() -> None:
        fed = PrefixIndex()
        for ev in events:
            fed.apply("e", ev)

    best, _ = timed(apply_all, 20)
    print(f"\napply, one BlockStored per block:  {best / PROMPT_BLOCKS * 1e6:.2f} us/block")
    snap = index.snapshot()
    best, _ = timed(index.snapshot, 3)
    restored = PrefixIndex()
    best_r, _ = timed(lambda: restored.restore(snap), 3)
    print(
        f"snapshot of the index: {best * 1e3:.0f} ms; restore {best_r * 1e3:.0f} ms; "
        f"{sum(len(str(v)) for e in snap['engines'] for v in e.values()) / 1e6:.1f} MB as text"
    )


if __name__ == "__main__":
    main()
