"""The dispatchers' shared view of the engines, and the choice of engine made on it.

Every dispatcher keeps the same view, so more workers (or gateways) never split it:

- which prompt blocks each engine holds (``PrefixIndex``): from the engine's own KV cache events,
  which each dispatcher reads from the engine's publisher (ZMQ fans them out), and, for an engine
  without events, from what the stack sent it, told to every dispatcher in the ``RouteNote``
  that says where a generation went;
- where every generation is (prefilling its uncached prompt, decoding, done) on which engine:
  ``RouteNote``s on ``Subjects.routing_notes``, each dispatcher's own applied at once;
- a dispatcher that starts asks a peer for a ``RoutingSnapshot`` (the index, the last KV batch
  applied per engine, the generations in flight), then reads each engine's events from there.

``rank`` is the ``SelectionPolicy``: ``cache_aware`` ranks by expected cost, the prompt tokens
the engine must prefill plus its queued prefill and ``decode_weight`` per running generation
(``policy.choose``); ``least_load`` without the cache; ``round_robin`` in turn. A resumed
generation is ranked on its prompt and the output so far, so it goes where they are cached."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from contracts.messages.generate import GenerateRequest
from contracts.messages.routing import Phase, RouteNote, RoutingSnapshot, SnapshotRequest
from services.common.bus import Bus
from services.common.errors import ChorusError
from services.common.kv_events import EventBatch
from services.common.metrics import ROUTING_DECISIONS, ROUTING_INDEX_BLOCKS
from services.dispatcher.fleet import Engine, RoundRobin
from services.dispatcher.kv_subscriber import KvSubscriber
from services.dispatcher.routing.index import PrefixIndex
from services.dispatcher.routing.policy import EngineView, choose
from services.dispatcher.settings import Settings

log = logging.getLogger("chorus.dispatcher.routing")

NOTE = TypeAdapter(RouteNote)
SNAPSHOT = TypeAdapter(RoutingSnapshot)
SNAPSHOT_QUEUE = "routing-snapshot"  # one peer answers a snapshot request
SNAPSHOT_TIMEOUT_S = 3.0
FLIGHT_EXPIRY_S = 900.0  # a generation nobody ended (its dispatcher lost a note) stops counting
RECENT_S = 30.0  # an engine that served a generation this long ago still has conversations to come back


@dataclass
class Flight:
    """A generation on an engine, as the dispatcher that sent it told."""

    note: RouteNote
    since: float = field(default_factory=time.monotonic)


@dataclass
class Load:
    queued: int = 0  # prompt tokens sent and not prefilled yet
    running: int = 0  # generations decoding
    context: int = 0  # the prompt tokens of every generation on the engine


@dataclass(frozen=True)
class Decision:
    """What ``rank`` found for a request: its chains (by block size), the tokens each engine
    holds of it, and why the first engine ranked first."""

    tokens: int
    chains: dict[int, list[int]]
    cached: dict[str, int]
    ranked_first: str
    reason: str


def mode_of(setting: str, engines: Sequence[Engine]) -> str:
    """``auto``: cache_aware when there is a choice to make, else round_robin."""
    if setting != "auto":
        return setting
    return "cache_aware" if len(engines) > 1 else "round_robin"


class Router:
    def __init__(self, settings: Settings, engines: Sequence[Engine]) -> None:
        self.settings = settings
        self.instance = settings.instance_id
        self.mode = mode_of(settings.routing, engines)
        self.index = PrefixIndex(block_size=settings.kv_block_size)
        self.kv_seq: dict[str, int] = {}
        self.flights: dict[str, Flight] = {}
        self.subscribers: dict[str, KvSubscriber] = {}
        self._decisions: dict[str, Decision] = {}
        self._round_robin = RoundRobin()
        # ties rotate from a point of this dispatcher's own: two dispatchers that both see equal
        # engines do not both send their first request to the first engine
        self._turn = itertools.count(random.randrange(1 << 16))
        self._bus: Bus | None = None
        self._outbox: asyncio.Queue[RouteNote] = asyncio.Queue()
        self._last_served: dict[str, float] = {}  # engine -> when a generation last ended there
        for engine in engines:
            spec = engine.spec
            block_size = spec.block_size if spec and spec.block_size else settings.kv_block_size
            capacity = spec.capacity if spec and spec.capacity else settings.kv_capacity_tokens
            self.index.add_engine(engine.url, block_size=block_size, capacity=max(1, capacity // block_size))
            ROUTING_INDEX_BLOCKS.labels(engine.url).set_function(functools.partial(self.index.size, engine.url))
            if spec is not None and spec.kv_events:
                self.subscribers[engine.url] = KvSubscriber(
                    spec.kv_events,
                    spec.kv_replay,
                    on_batch=functools.partial(self._on_batch, engine.url),
                    on_reset=functools.partial(self._on_reset, engine.url),
                    silence_s=settings.kv_silence_s,
                    engine=engine.url,
                )

    # -- joining the bus ---------------------------------------------------------------------
    async def join(self, bus: Bus, tg: asyncio.TaskGroup, stop: asyncio.Event) -> None:
        """Catch up from a peer, then hear the others' notes, answer snapshot requests and read
        the engines' KV events (until ``stop``)."""
        self._bus = bus
        subjects = bus.subjects
        if self.mode == "cache_aware":
            await self._catch_up(bus)
        await bus.subscribe(subjects.routing_notes, NOTE, self._on_note)
        await bus.nc.subscribe(subjects.routing_snapshot, queue=SNAPSHOT_QUEUE, cb=self._answer_snapshot)
        sender = tg.create_task(self._send(bus))
        tg.create_task(_cancel_when(stop, sender))
        if self.mode == "cache_aware":
            for subscriber in self.subscribers.values():
                tg.create_task(subscriber.run(stop))

    async def _catch_up(self, bus: Bus) -> None:
        try:
            snapshot = await bus.request(
                bus.subjects.routing_snapshot,
                SnapshotRequest(dispatcher=self.instance),
                SNAPSHOT,
                timeout=SNAPSHOT_TIMEOUT_S,
                service="dispatcher",
            )
        except ChorusError:  # the first dispatcher (or none answers): start from nothing
            return
        try:
            self.index.restore(snapshot.index)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("the routing snapshot from a peer could not be read (%s); starting from nothing", exc)
            return
        for engine, seq in snapshot.kv_seq.items():
            self.kv_seq[engine] = seq
            subscriber = self.subscribers.get(engine)
            if subscriber is not None:
                subscriber.last_seq = seq  # events since are replayed (or the view reset)
        for note in snapshot.in_flight:
            self.flights[note.generation_id] = Flight(note)
        now = time.monotonic()
        for engine, ago in snapshot.served_ago.items():
            self._last_served[engine] = now - max(0.0, ago)
        log.info(
            "routing view caught up from a peer: %d blocks, %d generations in flight",
            len(self.index),
            len(self.flights),
        )

    async def _answer_snapshot(self, msg: Any) -> None:
        if not msg.reply or self._bus is None:
            return
        with contextlib.suppress(ValidationError, ValueError):
            if SnapshotRequest.model_validate_json(msg.data).dispatcher == self.instance:
                return
        now = time.monotonic()
        snapshot = RoutingSnapshot(
            index=self.index.snapshot(),
            kv_seq=dict(self.kv_seq),
            in_flight=[f.note for f in self.flights.values()],
            served_ago={engine: now - at for engine, at in self._last_served.items()},
        )
        with contextlib.suppress(Exception):
            await self._bus.publish(msg.reply, snapshot)

    # -- the choice ---------------------------------------------------------------------------
    def rank(self, request: GenerateRequest, engines: Sequence[Engine]) -> list[Engine]:
        if self.mode == "round_robin" or not engines:
            return self._round_robin.rank(request, engines)
        tokens = [*request.prompt_token_ids, *request.resume_tokens]
        chains: dict[int, list[int]] = {}
        cached: dict[str, int] = {}
        if self.mode == "cache_aware":
            for engine in engines:  # an engine without events that went down may have restarted
                if engine.healthy is False and not self.index.fed_by_events(engine.url):
                    self.index.reset(engine.url)
            chains = self.index.chains(tokens)
            cached = self.index.cached_tokens(chains)
        loads = self.loads()
        lately = time.monotonic() - RECENT_S
        views = [
            EngineView(
                id=e.url,
                healthy=e.usable,
                block_size=self.index.block_size(e.url),
                queued_prefill_tokens=loads[e.url].queued if e.url in loads else 0,
                running=loads[e.url].running if e.url in loads else 0,
                running_tokens=loads[e.url].context if e.url in loads else 0,
                recent=self._last_served.get(e.url, -math.inf) >= lately,
            )
            for e in engines
        ]
        ranked = choose(
            len(tokens),
            cached,
            views,
            decode_weight=self.settings.decode_weight,
            work_weight=self.settings.work_weight,
            turn=next(self._turn),
        )
        if ranked:
            first = ranked[0][0]
            self._decisions[request.generation_id] = Decision(len(tokens), chains, cached, first, ranked[0][2])
            # counted against the engine now, not once it answers: the next request (the same
            # burst) already sees it queued there; ``started`` moves it if another engine took it
            self._tell(self._note(request, first, cached.get(first, 0), "prefill"))
        by_url = {e.url: e for e in engines}
        return [by_url[engine] for engine, _, _ in ranked]

    def loads(self) -> dict[str, Load]:
        """Per engine: prompt tokens sent and not prefilled yet, generations decoding and the
        context they hold."""
        loads: dict[str, Load] = {}
        now = time.monotonic()
        for gid, flight in list(self.flights.items()):
            if now - flight.since > FLIGHT_EXPIRY_S:
                del self.flights[gid]
                continue
            note = flight.note
            load = loads.setdefault(note.engine, Load())
            if note.phase == "prefill":
                load.queued += note.prefill_tokens
            else:
                load.running += 1
            load.context += note.context_tokens
        return loads

    def expected_cached(self, generation_id: str, engine: str) -> int:
        decision = self._decisions.get(generation_id)
        return decision.cached.get(engine, 0) if decision is not None else 0

    # -- where a generation is ----------------------------------------------------------------
    def started(self, request: GenerateRequest, engine: Engine) -> None:
        """``engine`` took ``request``: it is prefilling what it does not hold."""
        decision = self._decisions.pop(request.generation_id, None)
        cached = decision.cached.get(engine.url, 0) if decision is not None else 0
        # the reason of the first choice; a later one (the first refused the connection) is load's
        first = decision is not None and decision.ranked_first == engine.url
        ROUTING_DECISIONS.labels(engine.url, decision.reason if first and decision else "load").inc()
        note = self._note(request, engine.url, cached, "prefill")
        if decision is not None and not self.index.fed_by_events(engine.url):
            blocks = decision.chains.get(note.block_size, [])
            self.index.record_sent(engine.url, blocks)
            note = note.model_copy(update={"blocks": blocks})
        self._tell(note)

    def _note(self, request: GenerateRequest, engine: str, cached: int, phase: Phase) -> RouteNote:
        tokens = len(request.prompt_token_ids) + len(request.resume_tokens)
        return RouteNote(
            dispatcher=self.instance,
            generation_id=request.generation_id,
            engine=engine,
            phase=phase,
            prefill_tokens=max(0, tokens - cached),
            context_tokens=tokens,
            block_size=self.index.block_size(engine),
        )

    def decoding(self, request: GenerateRequest) -> None:
        flight = self.flights.get(request.generation_id)
        if flight is not None and flight.note.phase == "prefill":
            self._tell(flight.note.model_copy(update={"phase": "decode", "prefill_tokens": 0, "blocks": []}))

    def ended(self, request: GenerateRequest) -> None:
        self._decisions.pop(request.generation_id, None)
        flight = self.flights.get(request.generation_id)
        if flight is not None:
            self._tell(flight.note.model_copy(update={"phase": "done", "prefill_tokens": 0, "blocks": []}))

    def on_dispatcher_death(self, instance: str) -> None:
        """A dispatcher died: its generations no longer load their engines."""
        for gid in [g for g, f in self.flights.items() if f.note.dispatcher == instance]:
            del self.flights[gid]

    def _tell(self, note: RouteNote) -> None:
        """Apply ``note`` here and tell the other dispatchers: at once when the connection can
        write in this step and nothing waits before it, else through the sender's queue."""
        self._apply(note)
        bus = self._bus
        if bus is None or self.mode == "round_robin":
            return
        if not (self._outbox.empty() and bus.publish_nowait(bus.subjects.routing_notes, note)):
            self._outbox.put_nowait(note)

    async def _send(self, bus: Bus) -> None:
        """The notes ``_tell`` could not write at once, in order (a note lost to a NATS outage
        only skews a peer's load view until its generation ends or expires)."""
        while True:
            note = await self._outbox.get()
            try:
                await bus.publish(bus.subjects.routing_notes, note)
            except Exception as exc:  # noqa: BLE001 - logged; the next note is tried
                log.debug("a routing note was not sent: %s", exc)

    async def _on_note(self, note: RouteNote) -> None:
        if note.dispatcher != self.instance:
            self._apply(note)

    def _apply(self, note: RouteNote) -> None:
        if note.phase == "done":
            self.flights.pop(note.generation_id, None)
            self._last_served[note.engine] = time.monotonic()
            return
        self.flights[note.generation_id] = Flight(note)
        if note.blocks and note.dispatcher != self.instance:
            self.index.record_sent(note.engine, note.blocks)

    # -- the engines' KV events ---------------------------------------------------------------
    def _on_batch(self, engine: str, seq: int, batch: EventBatch) -> None:
        for event in batch.events:
            self.index.apply(engine, event)
        self.kv_seq[engine] = seq

    def _on_reset(self, engine: str, reason: str) -> None:
        log.warning("routing: the view of %s's KV cache was reset: %s", engine, reason)
        self.index.reset(engine)
        self.kv_seq.pop(engine, None)


async def _cancel_when(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    await stop.wait()
    task.cancel()
