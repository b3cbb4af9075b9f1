"""`chorus up`'s arguments, refused before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.infra.test_cli import _env


@pytest.mark.parametrize(
    ("flag", "value"), [("--encoders", "-1"), ("--dispatchers", "0"), ("--parser-workers", "0"), ("--encoders", "x")]
)
def test_a_process_count_out_of_range_is_refused(flag: str, value: str) -> None:
    """`chorus up` refuses a stack without a dispatcher or a parser before starting anything;
    encoders may be 0 (each dispatcher renders its own prompts)."""
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "up", flag, value],
        text=True,
        capture_output=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert done.returncode == 2, done
    assert f"argument {flag}: want a whole number of at least" in done.stderr
