"""Waiting in tests for what another process, connection or task makes true: the condition is
polled until it holds, and a test whose condition never holds fails at the deadline saying
what it waited for. Prefer an event or a future when the test has one to await; poll when the
news comes from elsewhere (a server's state, a log file, a process's children).

``wait_until`` for synchronous tests, ``until`` for asynchronous ones (its condition may be a
coroutine function: a request to ask). Both return the condition's first truthy value."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

EVERY_S = 0.05  # between two looks: quick enough for a test, light on a 2-core machine

What = str | Callable[[], str]  # what is awaited; a callable is asked only for the failure's message


def _timed_out(timeout: float, what: What) -> AssertionError:
    return AssertionError(f"not within {timeout:g}s: {what() if callable(what) else what}")


def wait_until(condition: Callable[[], T | None], timeout: float, what: What, *, every: float = EVERY_S) -> T:
    """The first truthy value of ``condition()``, asked every ``every`` seconds; an
    ``AssertionError`` naming ``what`` when there is none within ``timeout`` seconds. What the
    condition raises goes to the caller."""
    deadline = time.monotonic() + timeout
    while True:
        last_look = time.monotonic() >= deadline
        if value := condition():
            return value
        if last_look:
            raise _timed_out(timeout, what)
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))


@overload
async def until(
    condition: Callable[[], Awaitable[T | None]], timeout: float, what: What, *, every: float = EVERY_S
) -> T: ...
@overload
async def until(condition: Callable[[], T | None], timeout: float, what: What, *, every: float = EVERY_S) -> T: ...
async def until(condition: Callable[[], Any], timeout: float, what: What, *, every: float = EVERY_S) -> Any:
    """``wait_until`` in a running loop (the loop goes on between looks); ``condition`` may be
    a coroutine function, awaited at each look."""
    deadline = time.monotonic() + timeout
    while True:
        last_look = time.monotonic() >= deadline
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if last_look:
            raise _timed_out(timeout, what)
        await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))
