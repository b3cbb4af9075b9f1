"""Engine workers, how one is chosen for a request, and their health.

A ``SelectionPolicy`` ranks the workers for a request (the dispatcher tries them in that order
while connections fail). It sees the whole request, ``selection_text`` and prompt ids included,
and each worker's health and in-flight count: enough for load- or prefix-aware policies."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from contracts.messages.generate import GenerateRequest
from services.common.metrics import WORKER_IN_FLIGHT, WORKER_UP
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.base import EngineAdapter
from services.dispatcher.engines.http import EngineHttp, HttpError
from services.dispatcher.engines.sglang import Mode

log = logging.getLogger("chorus.dispatcher.workers")

# an engine that has not answered yet this soon after the dispatcher started is starting (an
# engine started with the stack listens a moment later), not down: no warning, not reported
START_GRACE_S = 5.0


@dataclass(eq=False)
class Worker:
    url: str
    kind: str  # vllm | sglang | sim (as configured)
    adapter: EngineAdapter
    healthy: bool | None = None  # None until the first health poll
    _in_flight: int = 0
    last_error: str = ""
    reported: bool = False  # its being down was reported (a warning, and in the readiness detail)
    since: float = field(default_factory=time.monotonic)  # created (the dispatcher's start)
    ever_up: bool = False
    simulated: bool = False  # the simulator answers there (its X-Chorus-Simulator header)

    @property
    def usable(self) -> bool:
        return self.healthy is not False

    @property
    def in_flight(self) -> int:
        """Generations streaming from this worker now (also the metric of the same name)."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, n: int) -> None:
        self._in_flight = n
        WORKER_IN_FLIGHT.labels(self.url).set(n)

    def mark_down(self, reason: str) -> None:
        starting = not self.ever_up and time.monotonic() - self.since < START_GRACE_S
        if not self.reported and not starting:
            log.warning("engine worker %s is down: %s", self.url, reason)
            self.reported = True
        elif starting and self.healthy is None:
            log.info("engine worker %s does not answer yet (starting?): %s", self.url, reason)
        self.healthy, self.last_error = False, reason
        WORKER_UP.labels(self.url, self.kind).set(0)

    def mark_up(self) -> None:
        if self.reported:
            log.info("engine worker %s is back", self.url)
        elif not self.ever_up:
            log.info("engine worker %s is up", self.url)
        self.healthy, self.last_error, self.reported, self.ever_up = True, "", False, True
        WORKER_UP.labels(self.url, self.kind).set(1)


def parse_workers(
    specs: Sequence[str], *, sglang_mode: Mode = "auto", sglang_default_max_tokens: int | None = None
) -> list[Worker]:
    """Workers from "KIND=URL" specs; ``sglang+incremental=URL`` pins a worker's stream mode."""
    workers = []
    for spec in specs:
        kind, _, url = spec.partition("=")
        base, _, mode = kind.partition("+")
        adapter = make_adapter(
            base,
            sglang_mode=mode or sglang_mode,  # type: ignore[arg-type]
            sglang_default_max_tokens=sglang_default_max_tokens,
        )
        workers.append(Worker(url.rstrip("/"), base, adapter))
    return workers


class SelectionPolicy(Protocol):
    def rank(self, request: GenerateRequest, workers: Sequence[Worker]) -> list[Worker]:
        """The workers to try for ``request``, best first; empty when none may serve it."""
        ...


class RoundRobin:
    """Each request starts one worker further; unhealthy workers are skipped, unless every
    worker is (then all are tried: the health poll may lag behind a restart)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def rank(self, request: GenerateRequest, workers: Sequence[Worker]) -> list[Worker]:
        if not workers:
            return []
        start = next(self._counter) % len(workers)
        rotated = [*workers[start:], *workers[:start]]
        usable = [w for w in rotated if w.usable]
        return usable or rotated


async def probe(http: EngineHttp, worker: Worker, timeout: float) -> None:
    """One ``GET /health``: up on 200, down otherwise."""
    # OpenAI-compatible upstreams (hosted providers, llama.cpp) need not have /health
    path = "/v1/models" if worker.kind in ("openai", "openai-chat") else "/health"
    try:
        reply = await http.fetch("GET", f"{worker.url}{path}", timeout=timeout)
    except HttpError as exc:
        worker.mark_down(f"health check failed: {type(exc).__name__}: {exc}")
        return
    status = reply.status
    worker.simulated = worker.kind == "sim" or reply.headers.get("x-chorus-simulator") == "true"
    if status == 200:
        worker.mark_up()
    else:
        worker.mark_down(f"health check answered HTTP {status}")


async def poll_health(
    http: EngineHttp,
    workers: Sequence[Worker],
    *,
    interval: float,
    timeout: float,
    stop: asyncio.Event,
    first_done: asyncio.Event | None = None,
    retry_interval: float | None = None,
) -> None:
    """Probe every worker now and every ``interval`` seconds until ``stop``; while a worker is
    down, every ``retry_interval`` (an engine coming up is noticed quickly)."""
    while not stop.is_set():
        async with asyncio.TaskGroup() as tg:
            for worker in workers:
                tg.create_task(probe(http, worker, timeout))
        if first_done is not None:
            first_done.set()
        wait = interval
        if retry_interval is not None and not all(w.healthy for w in workers):
            wait = min(interval, retry_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


def readiness(workers: Sequence[Worker]) -> tuple[bool, str]:
    """Ready when at least one engine worker answered its health check."""
    if not workers:
        return False, "no engine workers configured (CHORUS_ENGINES)"
    up = [w for w in workers if w.healthy]
    detail = f"{len(up)}/{len(workers)} engine workers up"
    # a worker that fails in its first seconds "does not answer yet"; after, it "is down"
    notes = [
        f"{w.url} is down: {w.last_error}" if w.reported else f"{w.url} does not answer yet: {w.last_error}"
        for w in workers
        if w.healthy is False
    ]
    if notes:
        detail += "; " + "; ".join(notes)
    return bool(up), detail
