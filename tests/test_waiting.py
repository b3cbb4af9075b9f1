"""The tests' waiting helpers: the condition's first truthy value, or at the deadline an
``AssertionError`` saying what was awaited; the condition asked once more at the deadline."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.waiting import until, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    looks = itertools.count()
    assert wait_until(lambda: next(looks) >= 2 and "third look", 1, "a third look", every=0.001) == "third look"


def test_wait_until_fails_at_the_deadline_naming_what_it_awaited() -> None:
    looks = itertools.count()
    with pytest.raises(AssertionError, match=r"^not within 0.05s: the impossible \(2\)$"):
        wait_until(lambda: next(looks) < 0, 0.05, lambda: "the impossible (2)", every=0.01)
    assert next(looks) >= 3  # looked more than once, the last time at the deadline


def test_what_a_condition_raises_is_the_callers() -> None:
    def broken() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="the process exited"):
        wait_until(broken, 1, "never asked for")


async def test_until_takes_a_plain_condition_and_lets_the_loop_run() -> None:
    changed = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, changed.set)
    assert await until(changed.is_set, 1, "the event set by another callback")


async def test_until_awaits_a_coroutine_condition() -> None:
    looks = itertools.count()

    async def ask() -> list[int] | None:
        await asyncio.sleep(0)  # a look that takes a turn of the loop, as a request would
        return [1] if next(looks) >= 1 else None

    assert await until(ask, 1, "an answer", every=0.001) == [1]
    with pytest.raises(AssertionError, match=r"^not within 0.02s: nothing$"):
        await until(lambda: [], 0.02, "nothing")
