"""The engines a dispatcher sends to (vLLM, SGLang, text upstreams), their health, and the
plainest way to choose one.

A ``SelectionPolicy`` ranks the engines for a request (the dispatcher tries them in that order
while connections fail). ``RoundRobin`` is here; the cache- and load-aware ``Router``, shared by
every dispatcher over the bus, is in ``routing/router.py``."""

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
from services.common.engine_spec import EngineSpec, parse_engine
from services.common.metrics import ENGINE_IN_FLIGHT, ENGINE_UP
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.base import EngineAdapter
from services.dispatcher.engines.http import EngineHttp, HttpError
from services.dispatcher.engines.sglang import Mode

log = logging.getLogger("chorus.dispatcher.engines")

# an engine that has not answered yet this soon after the dispatcher started is starting (an
# engine started with the stack listens a moment later), not down: no warning, not reported
START_GRACE_S = 5.0


@dataclass(eq=False)
class Engine:
    url: str
    kind: str  # vllm | sglang | sim | openai | openai-chat (as configured)
    adapter: EngineAdapter
    spec: EngineSpec | None = None  # as configured (options: KV events, block size, capacity)
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
        """Generations streaming from this engine now (also the metric of the same name)."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, n: int) -> None:
        self._in_flight = n
        ENGINE_IN_FLIGHT.labels(self.url).set(n)

    def mark_down(self, reason: str) -> None:
        starting = not self.ever_up and time.monotonic() - self.since < START_GRACE_S
        if not self.reported and not starting:
            log.warning("engine %s is down: %s", self.url, reason)
            self.reported = True
        elif starting and self.healthy is None:
            log.info("engine %s does not answer yet (starting?): %s", self.url, reason)
        self.healthy, self.last_error = False, reason
        ENGINE_UP.labels(self.url, self.kind).set(0)

    def mark_up(self) -> None:
        if self.reported:
            log.info("engine %s is back", self.url)
        elif not self.ever_up:
            log.info("engine %s is up", self.url)
        self.healthy, self.last_error, self.reported, self.ever_up = True, "", False, True
        ENGINE_UP.labels(self.url, self.kind).set(1)


def parse_engines(
    specs: Sequence[str], *, sglang_mode: Mode = "auto", sglang_default_max_tokens: int | None = None
) -> list[Engine]:
    """Engines from their specs (``services/common/engine_spec.py``: ``KIND=URL[,OPTION=VALUE]``;
    ``sglang+incremental=URL`` pins an engine's stream mode)."""
    engines = []
    for text in specs:
        spec = parse_engine(text)
        adapter = make_adapter(
            spec.kind,
            sglang_mode=spec.mode or sglang_mode,  # type: ignore[arg-type]
            sglang_default_max_tokens=sglang_default_max_tokens,
        )
        engines.append(Engine(spec.url, spec.kind, adapter, spec))
    return engines


class SelectionPolicy(Protocol):
    def rank(self, request: GenerateRequest, engines: Sequence[Engine]) -> list[Engine]:
        """The engines to try for ``request``, best first; empty when none may serve it."""
        ...


class RoundRobin:
    """Each request starts one engine further; unhealthy engines are skipped, unless every
    engine is (then all are tried: the health poll may lag behind a restart)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def rank(self, request: GenerateRequest, engines: Sequence[Engine]) -> list[Engine]:
        if not engines:
            return []
        start = next(self._counter) % len(engines)
        rotated = [*engines[start:], *engines[:start]]
        usable = [w for w in rotated if w.usable]
        return usable or rotated


async def probe(http: EngineHttp, engine: Engine, timeout: float) -> None:
    """One ``GET /health``: up on 200, down otherwise."""
    # OpenAI-compatible upstreams (hosted providers, llama.cpp) need not have /health
    path = "/v1/models" if engine.kind in ("openai", "openai-chat") else "/health"
    try:
        reply = await http.fetch("GET", f"{engine.url}{path}", timeout=timeout)
    except HttpError as exc:
        engine.mark_down(f"health check failed: {type(exc).__name__}: {exc}")
        return
    status = reply.status
    engine.simulated = engine.kind == "sim" or reply.headers.get("x-chorus-simulator") == "true"
    if status == 200:
        engine.mark_up()
    else:
        engine.mark_down(f"health check answered HTTP {status}")


async def poll_health(
    http: EngineHttp,
    engines: Sequence[Engine],
    *,
    interval: float,
    timeout: float,
    stop: asyncio.Event,
    first_done: asyncio.Event | None = None,
    retry_interval: float | None = None,
) -> None:
    """Probe every engine now and every ``interval`` seconds until ``stop``; while an engine is
    down, every ``retry_interval`` (an engine coming up is noticed quickly)."""
    while not stop.is_set():
        async with asyncio.TaskGroup() as tg:
            for engine in engines:
                tg.create_task(probe(http, engine, timeout))
        if first_done is not None:
            first_done.set()
        wait = interval
        if retry_interval is not None and not all(w.healthy for w in engines):
            wait = min(interval, retry_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


def readiness(engines: Sequence[Engine]) -> tuple[bool, str]:
    """Ready when at least one engine answered its health check."""
    if not engines:
        return False, "no engines configured (CHORUS_ENGINES)"
    up = [w for w in engines if w.healthy]
    detail = f"{len(up)}/{len(engines)} engines up"
    # an engine that fails in its first seconds "does not answer yet"; after, it "is down"
    notes = [
        f"{w.url} is down: {w.last_error}" if w.reported else f"{w.url} does not answer yet: {w.last_error}"
        for w in engines
        if w.healthy is False
    ]
    if notes:
        detail += "; " + "; ".join(notes)
    return bool(up), detail
