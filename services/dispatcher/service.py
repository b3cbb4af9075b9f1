"""The dispatcher's state and behaviour, independent of the bus wiring.

``Dispatcher`` owns the engine HTTP client (``engines/http.py``), the engine workers and their
health poll, and a TaskGroup holding every generation it streams. For each ``GenerateRequest``
it picks a worker, opens the engine stream, tells the owning gateway (``GenerationAccepted`` or
``GenerationFailed``) and relays the tokens to the generation's parser worker. ``cancel`` aborts
a generation in the engine; so does the death of its gateway (nobody would read it); draining
finishes what is streaming; stopping with work in hand ends it as retryable, so the gateway
continues the generation on another dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.generate import (
    EventFrame,
    GatewayEvent,
    GenerateRequest,
    GenerationAccepted,
    GenerationFailed,
    TokenBatch,
    TokenFrame,
)
from services.common.bus import Bus
from services.common.outbox import Outboxes
from services.common.recent import Recent
from services.dispatcher.batches import BatchWriter, merge, relay
from services.dispatcher.engines.base import EngineFailure
from services.dispatcher.engines.http import EngineHttp
from services.dispatcher.engines.stream import EngineStream, open_stream
from services.dispatcher.fleet import Engine, SelectionPolicy, parse_engines, poll_health, readiness
from services.dispatcher.routing.router import Router
from services.dispatcher.settings import Settings
from services.dispatcher.tracing import EngineSpan

log = logging.getLogger("chorus.dispatcher")

Ending = Literal["cancel", "orphaned", "shutdown"]


@dataclass(eq=False)
class Active:
    """A generation this dispatcher is streaming (or still opening)."""

    request: GenerateRequest
    task: asyncio.Task[None] | None = None
    ending: Ending | None = None


class Dispatcher:
    def __init__(
        self, settings: Settings, *, policy: SelectionPolicy | None = None, engines: list[Engine] | None = None
    ) -> None:
        self.settings = settings
        self.engines = (
            engines
            if engines is not None
            else parse_engines(
                settings.engines,
                sglang_mode=settings.sglang_stream_mode,
                sglang_default_max_tokens=settings.sglang_default_max_tokens,
            )
        )
        self.router = Router(settings, self.engines)
        self.policy: SelectionPolicy = policy or self.router
        self.active: dict[str, Active] = {}
        self.health_checked = asyncio.Event()
        self._cancelled = Recent()  # generations cancelled lately
        self._stop = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stack = contextlib.AsyncExitStack()
        self._tg: asyncio.TaskGroup | None = None
        self.http: EngineHttp | None = None
        self._tokens: Outboxes[TokenBatch, TokenFrame] | None = None
        self._events: Outboxes[GatewayEvent, EventFrame] | None = None
        self.bus: Bus | None = None

    # lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Dispatcher:
        s = self.settings
        self.http = EngineHttp(connect_timeout=s.connect_timeout_s, max_connections=s.max_connections)
        self._stack.push_async_callback(self.http.close)
        self._tg = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._stack.push_async_callback(self.shutdown)  # runs before the TaskGroup waits
        self._tg.create_task(
            poll_health(
                self.http,
                self.engines,
                interval=s.health_interval_s,
                timeout=s.health_timeout_s,
                stop=self._stop,
                first_done=self.health_checked,
                retry_interval=s.health_retry_s,
            )
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)

    def bind(self, bus: Bus, *, local_parsers: dict[str, Callable[[TokenFrame], None]] | None = None) -> None:
        """Where batches and gateway events go; ``local_parsers``: parsers in this process (by
        instance id), handed their frames without the bus."""
        self.bus = bus
        local = {bus.subjects.parser_tokens(parser): take for parser, take in (local_parsers or {}).items()}
        self._tokens = Outboxes(bus, lambda items: TokenFrame(batches=merge(items)), window=self.window, local=local)
        self._events = Outboxes(bus, lambda items: EventFrame(events=items))

    def window(self) -> float:
        """How long tokens wait for company (seconds): the base window when few generations
        stream, longer with each one in flight, up to the maximum (the stack's CPU per token
        falls as each message carries several of a generation's tokens)."""
        s = self.settings
        return (
            min(s.coalesce_window_ms * max(1, len(self.active)), max(s.coalesce_max_window_ms, s.coalesce_window_ms))
            / 1000
        )

    async def join(self) -> None:
        """Share the routing view with the other dispatchers (after ``bind``)."""
        assert self.bus is not None and self._tg is not None
        await self.router.join(self.bus, self._tg, self._stop)

    def readiness(self) -> tuple[bool, str]:
        return readiness(self.engines)

    @property
    def load(self) -> int:
        return len(self.active)

    async def drain(self) -> None:
        """Finish every generation in hand and send its last frames (the caller bounds how
        long): all of it leaves before the "stopping" heartbeat."""
        await self._idle.wait()
        for outboxes in (self._tokens, self._events):
            if outboxes is not None:
                await outboxes.flush()

    async def shutdown(self) -> None:
        """End every generation still streaming (retryable: the gateway continues it on
        another dispatcher), stop the health poll, send what is queued."""
        self._stop.set()
        for active in list(self.active.values()):
            self._end(active, "shutdown")
        tasks = [a.task for a in self.active.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.abort_timeout_s + 1)
        for outboxes in (self._tokens, self._events):
            if outboxes is not None:
                await outboxes.close()

    # bus handlers ----------------------------------------------------------------------
    async def on_generate(self, req: GenerateRequest) -> None:
        """Start streaming ``req`` and return at once."""
        if self._tg is None or self._stop.is_set():
            self._tell(
                req,
                GenerationFailed(
                    generation_id=req.generation_id,
                    stage="dispatcher",
                    error=BusError(
                        code=ErrorCode.SERVICE_UNAVAILABLE, message="the dispatcher is stopping", retryable=True
                    ),
                ),
            )
            return
        if req.generation_id in self._cancelled or time.time() > req.deadline:
            log.info("generation %s: given up before it started; dropped", req.generation_id)
            return
        active = Active(req)
        self.active[req.generation_id] = active
        self._idle.clear()
        active.task = self._tg.create_task(self._generate(active))
        # a task cancelled before its first step never runs its body (nor its ``finally``)
        active.task.add_done_callback(lambda _: self._forget(active))

    async def on_cancel(self, msg: Cancel) -> None:
        self._cancelled.add(msg.generation_id)
        active = self.active.get(msg.generation_id)
        if active is not None:
            self._end(active, "cancel")

    async def on_death(self, service: str, instance: str) -> None:
        """A gateway died: nobody reads its generations any more. A dispatcher died: its
        generations no longer load their engines."""
        if service == "dispatcher":
            self.router.on_dispatcher_death(instance)
            return
        if service != "gateway":
            return
        orphans = [a for a in self.active.values() if a.request.route.gateway == instance]
        if orphans:
            log.warning("gateway %s died: aborting its %d generation(s)", instance, len(orphans))
        for active in orphans:
            self._end(active, "orphaned")

    # internals -------------------------------------------------------------------------
    def _end(self, active: Active, why: Ending) -> None:
        if active.ending is not None:
            return
        active.ending = why
        if active.task is not None:
            active.task.cancel()

    def _forget(self, active: Active) -> None:
        if self.active.get(active.request.generation_id) is active:
            del self.active[active.request.generation_id]
        if not self.active:
            self._idle.set()

    def _tell(self, req: GenerateRequest, event: GatewayEvent) -> None:
        """An answer the gateway waits for before its first byte (accepted, or failed): never
        held back by a coalescing window, nor by the engine's first burst read after it."""
        assert self._events is not None and self.bus is not None
        self._events.put(self.bus.subjects.gateway_events(req.route.gateway), event, urgent=True)

    def _writer(self, req: GenerateRequest, span: EngineSpan) -> BatchWriter:
        assert self._tokens is not None and self.bus is not None
        subject = self.bus.subjects.parser_tokens(req.route.parser)
        tokens = self._tokens
        prefilling = True

        def put(batch: TokenBatch, urgent: bool) -> None:
            nonlocal prefilling
            tokens.put(subject, batch, urgent=urgent)  # (an urgent batch is sent in this call)
            span.batch(batch)
            if prefilling and batch.token_ids:  # the engine's first tokens: its prefill is done
                prefilling = False
                self.router.decoding(req)

        return BatchWriter(put, req)

    async def _generate(self, active: Active) -> None:
        """Open, relay, end; never raises (the TaskGroup would cancel its siblings)."""
        req = active.request
        span = EngineSpan(req)
        writer = self._writer(req, span)
        worker: Engine | None = None
        stream: EngineStream | None = None
        try:
            opened = await self._open_any(req)
            if isinstance(opened, BusError):
                span.failed(opened)
                self._tell(req, GenerationFailed(generation_id=req.generation_id, stage="dispatcher", error=opened))
                return
            worker, stream = opened
            span.accepted(worker.url, worker.kind, self.router.expected_cached(req.generation_id, worker.url))
            self.router.started(req, worker)
            self._tell(
                req,
                GenerationAccepted(
                    generation_id=req.generation_id,
                    dispatcher=self.settings.instance_id,
                    worker=worker.url,
                    engine=worker.kind,
                    prompt_tokens=len(req.prompt_token_ids),
                    render_ms=req.render_ms,
                ),
            )
            writer.open()
            await relay(stream, writer, self.window)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._ended(active, worker, stream, writer)
        except Exception:  # a bug here ends this generation, not the service
            log.exception("generation %s failed in the dispatcher", req.generation_id)
            error = BusError(code=ErrorCode.INTERNAL, message="the dispatcher failed", retryable=True)
            if writer.opened:
                writer.fail(error)
            else:
                span.failed(error)
                self._tell(req, GenerationFailed(generation_id=req.generation_id, stage="dispatcher", error=error))
        finally:
            span.end()
            self.router.ended(req)
            if worker is not None:
                worker.in_flight -= 1
            if stream is not None:
                stream.close()
            self._forget(active)

    async def _ended(
        self, active: Active, worker: Engine | None, stream: EngineStream | None, writer: BatchWriter
    ) -> None:
        """Cancelled, orphaned or shutting down: abort in the engine, then the last batch."""
        req = active.request
        if worker is not None and self.http is not None:
            if stream is not None:
                stream.close()  # vLLM: this is the abort
            try:
                await worker.adapter.abort(self.http, worker.url, req.generation_id, self.settings.abort_timeout_s)
            except Exception:  # the final batch matters more
                log.warning("aborting %s at %s failed", req.generation_id, worker.url, exc_info=True)
        if not writer.opened:
            return  # the parser has no session for it: nothing to end
        if active.ending == "shutdown":
            writer.fail(BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message="the dispatcher stopped", retryable=True))
        else:
            writer.final("abort")

    async def _open_any(self, req: GenerateRequest) -> tuple[Engine, EngineStream] | BusError:
        """The first worker (in policy order) whose engine takes the request; connection
        failures move on to the next, other failures are the answer."""
        assert self.http is not None
        ranked = self.policy.rank(req, self.engines)
        if req.resume_tokens:
            ranked = [w for w in ranked if w.adapter.resumable]
        if not ranked:
            reason = (
                "no engine can continue an interrupted output"
                if req.resume_tokens
                else "no engine workers are configured (CHORUS_ENGINES)"
            )
            return BusError(code=ErrorCode.ENGINE_UNAVAILABLE, message=reason)
        deadline = time.monotonic() + self.settings.accept_timeout_s
        failures: list[str] = []
        for worker in ranked:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            worker.in_flight += 1
            try:
                stream = await open_stream(
                    self.http,
                    worker.url,
                    worker.adapter,
                    req,
                    accept_timeout=remaining,
                    read_timeout=self.settings.read_timeout_s,
                )
            except EngineFailure as exc:
                worker.in_flight -= 1
                if not exc.retryable:
                    return exc.error
                worker.mark_down(exc.error.message)
                failures.append(exc.error.message)
                continue
            except BaseException:
                worker.in_flight -= 1
                raise
            worker.mark_up()
            return worker, stream
        if failures:
            log.warning("generation %s: no engine took it: %s", req.generation_id, "; ".join(failures))
        return BusError(
            code=ErrorCode.ENGINE_UNAVAILABLE,
            retryable=False,
            message="no engine could take the request: " + "; ".join(failures or ["timed out"]),
        )
