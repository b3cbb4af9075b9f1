"""The fleet benchmark runs end to end: every routing mode over fresh simulated engines, every
request served, the table printed. Its figures are not asserted (timings drift; a benchmark is
not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_fleet import MODES, QUICK, ideal_cached

ROOT = Path(__file__).resolve().parents[2]


def test_the_ideal_counts_whole_blocks_shared_with_any_earlier_prompt() -> None:
    shared = list(range(40))  # two whole blocks and 8 tokens
    prompts = [shared + [100] * 20, shared + [200] * 20, list(range(33)), list(range(32)), [7] * 16]
    # none before the first; two blocks of the first; two of either; one (the last token is
    # always computed); none
    assert ideal_cached(prompts) == [0, 32, 32, 16, 0]


@pytest.mark.slow
def test_quick_run_covers_every_mode_without_failures(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_fleet.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert list(figures["modes"]) == list(MODES)
    for name, mode in figures["modes"].items():
        assert mode["failures"] == [], name
        assert mode["requests"] == QUICK.conversations * QUICK.turns, name
        assert sum(mode["per_engine"]) == mode["requests"], name
        assert mode["ideal_cached_tokens"] > 0, name  # the engines' records were read
    assert "reuse of the ideal" in proc.stdout
    for mode in MODES.values():
        assert f"| {mode.label}" in proc.stdout
