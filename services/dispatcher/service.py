"""The dispatcher's state and behaviour, independent of the bus framework.

``Dispatcher`` owns the shared HTTP client, the engine workers and their health poll, and a
TaskGroup holding every token stream (a stream outlives the generate handler that started it).
``generate`` picks a worker, opens the engine stream and returns ``GenerateAccepted`` or a
``BusError``; ``cancel`` aborts a stream in the engine and ends it with ``finish_reason="abort"``;
``shutdown`` ends every stream with an error batch while the bus is still up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import httpx

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import GenerateAccepted, GenerateRequest
from services.dispatcher.batches import BatchWriter, Publish, relay
from services.dispatcher.engines.base import EngineFailure
from services.dispatcher.engines.stream import EngineStream, open_stream
from services.dispatcher.settings import Settings
from services.dispatcher.workers import (
    RoundRobin,
    SelectionPolicy,
    Worker,
    parse_workers,
    poll_health,
    readiness,
)

log = logging.getLogger("chorus.dispatcher")

# A cancel can overtake its generate request inside this process (concurrent handlers): one
# heard this recently refuses the request. Short, so a later retry under the same id works.
RECENT_CANCELS = 4096
RECENT_CANCEL_TTL_S = 2.0


@dataclass(eq=False)
class Active:
    """A request this dispatcher is streaming (or still opening)."""

    request: GenerateRequest
    task: asyncio.Task[None] | None = None
    started: bool = False  # the task has run: cancelling it now reaches its handlers
    ending: Literal["cancel", "shutdown"] | None = None


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        *,
        policy: SelectionPolicy | None = None,
        workers: list[Worker] | None = None,
    ) -> None:
        self.settings = settings
        self.policy: SelectionPolicy = policy or RoundRobin()
        self.workers = workers if workers is not None else parse_workers(
            settings.engines,
            sglang_mode=settings.sglang_stream_mode,
            sglang_default_max_tokens=settings.sglang_default_max_tokens,
        )
        self.active: dict[str, Active] = {}
        self.health_checked = asyncio.Event()
        self._recent_cancels: OrderedDict[str, float] = OrderedDict()  # id -> monotonic time
        self._publish: Publish | None = None
        self._stop = asyncio.Event()
        self._stack = contextlib.AsyncExitStack()
        self._tg: asyncio.TaskGroup | None = None
        self.client: httpx.AsyncClient | None = None

    # lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Dispatcher:
        s = self.settings
        self.client = await self._stack.enter_async_context(httpx.AsyncClient(
            timeout=httpx.Timeout(s.read_timeout_s, connect=s.connect_timeout_s, pool=s.accept_timeout_s),
            limits=httpx.Limits(max_connections=s.max_connections,
                                max_keepalive_connections=s.max_connections),
        ))
        self._tg = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._stack.push_async_callback(self.shutdown)  # runs before the TaskGroup waits
        self._tg.create_task(poll_health(
            self.client, self.workers, interval=s.health_interval_s, timeout=s.health_timeout_s,
            stop=self._stop, first_done=self.health_checked, retry_interval=s.health_retry_s,
        ))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)

    def bind(self, publish: Publish) -> None:
        """Where TokenBatch messages go (the raw NATS client's publish, in the service)."""
        self._publish = publish

    def readiness(self) -> tuple[bool, str]:
        return readiness(self.workers)

    async def shutdown(self) -> None:
        """End every stream (error batch: the dispatcher is stopping) and the health poll."""
        self._stop.set()
        for active in list(self.active.values()):
            self._end(active, "shutdown")
        tasks = [a.task for a in self.active.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.abort_timeout_s + 1)

    # requests --------------------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> GenerateAccepted | BusError:
        if self._tg is None or self.client is None or self._publish is None or self._stop.is_set():
            return BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message="the dispatcher is not running")
        heard = self._recent_cancels.get(req.request_id)
        if heard is not None and time.monotonic() - heard < RECENT_CANCEL_TTL_S:
            return BusError(code=ErrorCode.CANCELLED, message="the request was cancelled")
        ranked = self.policy.rank(req, self.workers)
        if not ranked:
            return BusError(code=ErrorCode.ENGINE_UNAVAILABLE,
                            message="no engine workers are configured (CHORUS_ENGINES)")
        active = Active(req)
        self.active[req.request_id] = active
        try:
            opened = await self._open_any(req, ranked)
        except BaseException:
            self._forget(active)
            raise
        if isinstance(opened, BusError):
            self._forget(active)
            return opened
        worker, stream = opened
        active.task = self._tg.create_task(self._stream(active, worker, stream))
        return GenerateAccepted(worker=worker.url, engine=worker.kind)

    async def _open_any(
        self, req: GenerateRequest, ranked: list[Worker]
    ) -> tuple[Worker, EngineStream] | BusError:
        """The first worker (in policy order) whose engine takes the request; connection
        failures move on to the next, other failures are the answer."""
        assert self.client is not None
        deadline = time.monotonic() + self.settings.accept_timeout_s
        failures: list[str] = []
        for worker in ranked:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            worker.in_flight += 1
            try:
                stream = await open_stream(
                    self.client, worker.url, worker.adapter, req, accept_timeout=remaining
                )
            except BaseException as exc:
                worker.in_flight -= 1
                if not isinstance(exc, EngineFailure):
                    raise
                if not exc.retryable:
                    return exc.error
                worker.mark_down(exc.error.message)
                failures.append(exc.error.message)
                continue
            worker.mark_up()
            return worker, stream
        return BusError(
            code=ErrorCode.ENGINE_UNAVAILABLE,
            message="no engine worker could take the request: " + "; ".join(failures or ["timed out"]),
        )

    def cancel(self, request_id: str) -> bool:
        """Abort the request if this dispatcher owns it (every dispatcher hears every cancel)."""
        self._recent_cancels[request_id] = time.monotonic()
        self._recent_cancels.move_to_end(request_id)
        while len(self._recent_cancels) > RECENT_CANCELS:
            self._recent_cancels.popitem(last=False)
        active = self.active.get(request_id)
        if active is None:
            return False
        self._end(active, "cancel")
        return True

    # internals -------------------------------------------------------------------------
    def _end(self, active: Active, why: Literal["cancel", "shutdown"]) -> None:
        if active.ending is not None:
            return
        active.ending = why
        if active.task is not None and active.started:
            active.task.cancel()  # else the task sees ``ending`` when it starts

    def _forget(self, active: Active) -> None:
        if self.active.get(active.request.request_id) is active:
            del self.active[active.request.request_id]

    async def _stream(self, active: Active, worker: Worker, stream: EngineStream) -> None:
        """Relay one engine stream; never raises (the TaskGroup would cancel its siblings)."""
        assert self._publish is not None and self.client is not None
        active.started = True
        writer = BatchWriter(self._publish, active.request)
        try:
            if active.ending is None:
                await relay(stream, writer)
            else:  # cancelled while the engine was answering
                await self._finish_ended(active, worker, stream, writer)
        except asyncio.CancelledError:
            if active.ending is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._finish_ended(active, worker, stream, writer)
        except Exception as exc:
            log.exception("stream %s from %s failed", active.request.request_id, worker.url)
            with contextlib.suppress(Exception):
                await writer.fail(BusError(code=ErrorCode.INTERNAL,
                                           message=f"dispatcher error: {type(exc).__name__}"))
        finally:
            worker.in_flight -= 1
            self._forget(active)
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _finish_ended(
        self, active: Active, worker: Worker, stream: EngineStream, writer: BatchWriter
    ) -> None:
        """Cancelled or shutting down: abort in the engine, then the last batch."""
        assert self.client is not None
        request_id = active.request.request_id
        try:
            await stream.aclose()  # vLLM: this is the abort
            await worker.adapter.abort(
                self.client, worker.url, request_id, self.settings.abort_timeout_s
            )
        except Exception:  # noqa: BLE001 - the final batch matters more
            log.warning("aborting %s at %s failed", request_id, worker.url, exc_info=True)
        if active.ending == "cancel":
            await writer.final("abort")
        else:
            await writer.fail(BusError(code=ErrorCode.SERVICE_UNAVAILABLE,
                                       message="the dispatcher is shutting down"))
