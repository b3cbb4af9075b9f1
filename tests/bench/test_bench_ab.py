"""The paired benchmark's request order treats its two trees alike."""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_ab import ORDERS


def predecessors(side: int, repeats: int = 3) -> Counter[int]:
    """What the requests of ``side`` follow, over whole cycles of the order."""
    seq = [j for _ in range(repeats) for order in ORDERS for j in order]
    return Counter(seq[i - 1] for i in range(1, len(seq)) if seq[i] == side)


def test_every_order_once() -> None:
    assert sorted(ORDERS) == sorted(itertools.permutations(range(3)))


def test_the_two_trees_follow_the_same_sides() -> None:
    first, second = predecessors(1), predecessors(2)
    # the same number of times after the direct call, after the other tree, after itself
    assert (first[0], first[2], first[1]) == (second[0], second[1], second[2])
    assert first[0] > 0 and first[2] > 0
