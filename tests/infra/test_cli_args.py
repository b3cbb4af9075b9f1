"""`chorus up`'s arguments, refused before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.infra.cli_process import _env


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--workers", "0"),
        ("--encoders", "0"),
        ("--dispatchers", "0"),
        ("--parsers", "0"),
        ("--parser-workers", "0"),
        ("--workers", "x"),
    ],
)
def test_a_process_count_out_of_range_is_refused(flag: str, value: str) -> None:
    """`chorus up` refuses a stack without a worker (or, with --split, without an encoder, a
    dispatcher or a parser) before starting anything."""
    done = _refused("up", "--split", flag, value)
    named = "--parsers/--parser-workers" if flag in ("--parsers", "--parser-workers") else flag  # the old name too
    assert f"argument {named}: want a whole number of at least" in done.stderr


def test_split_counts_need_split() -> None:
    """The counts of the split shape without --split would be ignored: refused, naming them."""
    done = _refused("up", "--parser-workers", "3", "--dispatchers", "2")
    assert "--dispatchers, --parsers: only with --split" in done.stderr


def _refused(*args: str) -> subprocess.CompletedProcess[str]:
    """`chorus ARGS`, which must exit 2 (argparse's usage error) without starting anything."""
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        text=True,
        capture_output=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert done.returncode == 2, done
    return done
