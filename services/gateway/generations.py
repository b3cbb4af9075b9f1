"""The gateway's generations: each one's job sent to a worker (or the encoders' group) on a
parser chosen from the heartbeats, the events that come back routed to it, and the deaths,
silences and reconnects that interrupt it (``generation.py``: one generation)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import AsyncIterator

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.generate import EventFrame
from services.common.bus import Bus
from services.common.errors import ChorusError
from services.common.heartbeat import Peer, Peers
from services.gateway.generation import EVENTS, Generation, GenerationSpec, Interrupted, Replayed

log = logging.getLogger("chorus.gateway.generation")


class Generations:
    """The gateway's generations: sends jobs, routes events back, watches the services."""

    def __init__(
        self,
        bus: Bus,
        peers: Peers,
        gateway_id: str,
        *,
        accept_timeout: float,
        first_timeout: float,
        idle_timeout: float,
        max_resumes: int = 3,
        replacement_wait: float = 15.0,
    ) -> None:
        self.bus = bus
        self.peers = peers
        self.gateway_id = gateway_id
        self.accept_timeout = accept_timeout
        self.first_timeout = first_timeout
        self.idle_timeout = idle_timeout
        self.max_resumes = max_resumes
        self.replacement_wait = replacement_wait
        self.subject = bus.subjects.gateway_events(gateway_id)
        self._active: dict[str, Generation] = {}  # generation id -> its generation
        self._watchdog: asyncio.Task[None] | None = None
        peers.on_death(self.on_death)

    async def start(self) -> None:
        await self.bus.subscribe(self.subject, EVENTS, self.on_frame, inline=True)
        self._watchdog = asyncio.get_running_loop().create_task(self.watch())

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

    # routing ----------------------------------------------------------------------------
    async def on_frame(self, frame: EventFrame) -> None:
        for event in frame.events:
            generation = self._active.get(event.generation_id)
            if generation is not None:
                generation.deliver(event)

    async def on_death(self, service: str, instance: str) -> None:
        for generation in list(self._active.values()):
            if (
                (service == "parser" and generation.parser == instance)
                or (service == "dispatcher" and generation.dispatcher == instance)
                # not taken by an engine yet: it may be on any encoder or dispatcher of the
                # groups, or on the one worker it was sent to
                or (
                    service in ("encoder", "dispatcher")
                    and generation.accepted is None
                    and generation.sent_to in ("", instance)
                )
            ):
                generation.deliver(Interrupted(generation.generation_id, f"the {service} serving it stopped"))

    async def watch(self, interval: float = 0.25) -> None:
        """Interrupt generations that waited too long for their next item, forever."""
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for generation in list(self._active.values()):
                limit = generation.wait_limit
                if limit and now - generation.waiting_since > limit:
                    generation.wait_limit = 0.0
                    generation.deliver(
                        Interrupted(generation.generation_id, f"no answer from the services for {limit:g}s")
                    )

    async def on_reconnect(self) -> None:
        """Messages may have been lost while the bus was cut: every attempt starts again."""
        for generation in list(self._active.values()):
            generation.deliver(Interrupted(generation.generation_id, "the connection to NATS was lost"))

    # jobs -------------------------------------------------------------------------------
    async def submit(self, generation: Generation) -> None:
        """Send ``generation``'s next attempt to the encoders, on a parser chosen from the
        heartbeats (least loaded). A service kind with no live instance is a 503 for a new
        request; a resumed one waits a little for a replacement to come up."""
        wait = self.replacement_wait if generation.attempt else 0.0
        for service in ("encoder", "dispatcher", "parser"):
            if not await self.peers.wait_usable(service, wait):
                raise ChorusError.of(
                    BusError(
                        code=ErrorCode.SERVICE_UNAVAILABLE, message=f"no {service} service is running", retryable=True
                    )
                )
        parser = self._remembering(generation) or self.peers.pick("parser")
        if parser is None:
            raise ChorusError.of(
                BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message="no parser service is running", retryable=True)
            )
        generation.parser = parser.beat.instance
        generation.sent_to = parser.beat.instance if self._is_worker(parser.beat.instance) else ""
        self._active.pop(generation.generation_id, None)
        job = generation.job(self.gateway_id)
        self._active[generation.generation_id] = generation
        subjects = self.bus.subjects
        await self.bus.publish(subjects.encoder_jobs(generation.sent_to) if generation.sent_to else subjects.jobs, job)

    def _remembering(self, generation: Generation) -> Peer | None:
        """The worker that remembers the prompt ``generation`` continues, while it takes work:
        only the new items go to it (``RenderedPrompt``)."""
        after = generation.spec.after
        if after is None or generation.whole or not self._is_worker(after.worker):
            return None
        return next((p for p in self.peers.alive("parser") if p.usable and p.beat.instance == after.worker), None)

    def _is_worker(self, parser: str) -> bool:
        """Whether ``parser`` is a worker's whose encoder and dispatcher take work (its
        engines answer): its job goes to that process, where it is rendered, streamed and
        parsed without crossing the bus; else to the encoders' queue group."""
        return all(
            any(p.usable and p.beat.instance == parser for p in self.peers.alive(role))
            for role in ("encoder", "dispatcher")
        )

    async def cancel(self, generation_id: str, reason: str = "client_disconnected") -> None:
        self._active.pop(generation_id, None)
        try:
            await self.bus.publish(self.bus.subjects.cancel, Cancel(generation_id=generation_id, reason=reason))
        except Exception:  # the bus is down: the dispatcher aborts it when this gateway's heartbeats stop
            log.warning("cancelling generation %s: the bus refused the message", generation_id, exc_info=True)

    @contextlib.asynccontextmanager
    async def open(self, spec: GenerationSpec, *, resume: Replayed | None = None) -> AsyncIterator[Generation]:
        if spec.encode.current_date is None:  # pinned, so a resumed attempt renders the same prompt
            spec = dataclasses.replace(
                spec, encode=spec.encode.model_copy(update={"current_date": dt.date.today().isoformat()})
            )
        generation = Generation(spec, self, self.first_timeout, self.idle_timeout)
        if resume is not None:
            generation.tokens = list(resume.tokens)
            generation.salt = uuid.uuid4().hex[:6]  # not the id the first owner used
            generation.delivered.filter(list(resume.events))
            generation.delivered.new_attempt()  # its parser replays the tokens from the start
        try:
            await generation.begin()
            yield generation
        finally:
            if generation.generation_id:
                if generation.finished:
                    self._active.pop(generation.generation_id, None)
                else:
                    await self.cancel(generation.generation_id)

    @property
    def in_flight(self) -> int:
        return len(self._active)
