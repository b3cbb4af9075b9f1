"""The code stays as STYLE.md asks: ruff-clean, and mypy-clean on contracts/ and services/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "contracts", "services", "tests", "bench"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "contracts", "services"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
