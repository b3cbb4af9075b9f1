"""Background responses: run detached from any connection, and from any one gateway.

A background response is a job in Redis: its request (MCP credentials sealed), its input
items, a lease held by the gateway running it (renewed every second), a checkpoint before each
model turn, and the parse events and tokens behind each batch of the turn under way. Its
events go to a Redis stream that any replica replays. When the owner dies its lease lapses;
another gateway (each sweeps every second) claims it, restores the checkpoint, replays the
turn's logged parse events and continues the generation from its logged tokens: clients
following the stream see it go on, events they already have are not sent again. A cancel is
heard by every gateway (the owner stops the run) and left in Redis (a taker finds it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter

from contracts.messages.control import CancelResponse
from contracts.messages.items import ConversationItem
from contracts.messages.parse import ParseEvent
from services.gateway.context import GatewayContext
from services.gateway.responses.persist import dump, finish, stored_body
from services.gateway.responses.prepare import Prepared
from services.gateway.responses.request import McpToolParam, ResponsesRequest
from services.gateway.responses.response import TERMINAL_EVENTS
from services.gateway.responses.run import ResponseRun
from services.gateway.responses.steps import Resume, RunCheckpoint, Step
from services.gateway.store import EventLog, Jobs, ResponseStore, StoredResponse

log = logging.getLogger("chorus.gateway.background")

LEASE_MS = 3000
RENEW_S = 1.0
SWEEP_S = 1.0
_EVENTS: TypeAdapter[list[ParseEvent]] = TypeAdapter(list[ParseEvent])


class Job(BaseModel):
    """What another gateway needs to run a background response."""

    response_id: str
    created_at: int
    tenant: str | None = None  # whose it is (API keys configured)
    request: dict[str, Any]  # the validated request, MCP credentials taken out
    credentials: dict[str, str] = {}  # server_label -> sealed {"headers", "authorization"}
    input_ids: list[str]


class LoggedStep(BaseModel):
    turn: int
    parsed: list[ParseEvent]
    tokens: list[int]


def job_of(run: ResponseRun, seal: Any, tenant: str | None) -> Job:
    req = run.request
    body = req.model_dump(mode="json", by_alias=True, exclude_none=True)
    credentials: dict[str, str] = {}
    for i, tool in enumerate(req.tools or []):
        if isinstance(tool, McpToolParam) and (tool.headers or tool.authorization):
            credentials[tool.server_label] = seal(
                orjson.dumps({"headers": tool.headers, "authorization": tool.authorization}).decode()
            )
            body["tools"][i].pop("headers", None)
            body["tools"][i].pop("authorization", None)
    return Job(
        response_id=run.response_id,
        created_at=run.prepared.created_at,
        tenant=tenant,
        request=body,
        credentials=credentials,
        input_ids=[i.id for i in run.prepared.inputs if i.id],
    )


class Background:
    """The background responses this gateway runs, and the sweep that takes over orphans."""

    def __init__(self, ctx: GatewayContext, owner: str) -> None:
        self.ctx = ctx
        self.owner = owner
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cancelling: set[str] = set()  # runs told to cancel
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.ctx.bus.subscribe(self.ctx.bus.subjects.response_cancel, TypeAdapter(CancelResponse), self.on_cancel)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop sweeping, and stop the runs in hand (their leases lapse: another replica
        continues them)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)  # their ends, not ours

    async def on_cancel(self, msg: CancelResponse) -> None:
        self._cancel(msg.response_id)

    def _cancel(self, rid: str) -> None:
        """The run ends as cancelled: at once when it is waiting, else after the step in hand
        (the flag holds even if a library swallowed the task's cancellation)."""
        task = self.tasks.get(rid)
        if task is not None:
            self.cancelling.add(rid)
            task.cancel()

    # a new background response --------------------------------------------------------------
    async def submit(self, run: ResponseRun) -> None:
        store = run.prepared.store
        job = job_of(run, self.ctx.sealer.seal, store.tenant)
        await store.claim(run.response_id, self.owner, LEASE_MS)  # first: no sweep may take it
        await store.put_job(run.response_id, job.model_dump_json().encode(), run.prepared.inputs)
        self._launch(run, None)

    def _launch(self, run: ResponseRun, resume: Resume | None) -> None:
        task = asyncio.get_running_loop().create_task(self._drive(run, resume))
        self.tasks[run.response_id] = task
        task.add_done_callback(lambda _: self._ended(run.response_id, task))

    def _ended(self, rid: str, task: asyncio.Task[None]) -> None:
        if self.tasks.get(rid) is task:
            del self.tasks[rid]
            self.cancelling.discard(rid)

    # running --------------------------------------------------------------------------------
    async def _drive(self, run: ResponseRun, resume: Resume | None) -> None:
        rid = run.response_id
        store = run.prepared.store
        last_seq = await self._last_seq(store, rid)
        renewing = asyncio.get_running_loop().create_task(self._renew(store, rid, asyncio.current_task()))
        held: list[Any] = []  # the terminal event: followers see it once the response is stored
        try:
            try:
                await self._save(run, "in_progress")
                steps = run.steps(resume)
                async with contextlib.aclosing(steps):
                    async for step in steps:
                        held += await self._log(run, step, last_seq)
                        if rid in self.cancelling:
                            break
                if rid in self.cancelling:
                    held += await self._append(run, run.cancelled(), last_seq)
            except asyncio.CancelledError:
                if rid not in self.cancelling and not await store.cancel_requested(rid):
                    raise  # stopping, or the lease was lost: someone else continues
                held += await self._append(run, run.cancelled(), last_seq)
            except Exception as exc:  # noqa: BLE001 - a background failure is recorded, not raised
                log.warning("background response %s failed: %s", rid, exc)
                error = getattr(exc, "error", None)
                run.fail(getattr(error, "message", None) or "the response failed")
                held += await self._append(run, [run.final_event()], last_seq)
            # the run is over: storing it and telling its followers is not interrupted by a
            # cancel or a lost lease arriving now (it would leave a finished run unrecorded)
            await asyncio.shield(self._conclude(run, held, last_seq))
        except asyncio.CancelledError:
            log.info("background response %s left to another replica", rid)
        except Exception:
            log.exception("background response %s could not be finished", rid)
        finally:
            renewing.cancel()

    async def _conclude(self, run: ResponseRun, held: list[Any], last_seq: int) -> None:
        """Store the finished run, then send its terminal event, then let the job go."""
        await finish(run)
        await self._append(run, held, last_seq, hold=False)
        await run.prepared.store.done_running(run.response_id)

    async def _log(self, run: ResponseRun, step: Step, last_seq: int) -> list[Any]:
        """Log one step; its terminal event, if any, is returned to send once stored."""
        rid = run.response_id
        if step.checkpoint is not None:
            await run.prepared.store.put_checkpoint(rid, step.checkpoint.model_dump_json().encode())
        if step.parsed or step.tokens:
            logged = LoggedStep(turn=step.turn, parsed=step.parsed, tokens=step.tokens)
            await run.prepared.store.add_step(rid, logged.model_dump_json().encode())
        return await self._append(run, step.events, last_seq)

    async def _append(self, run: ResponseRun, events: list[Any], last_seq: int, *, hold: bool = True) -> list[Any]:
        """Events a follower has not seen (a taken-over run sends some again); with ``hold``,
        terminal events are returned, not sent (a follower that sees one may retrieve the
        response at once: it must be stored first)."""
        held = [e for e in events if hold and e.type in TERMINAL_EVENTS]
        fresh = [dump(e) for e in events if e.sequence_number > last_seq and not (hold and e.type in TERMINAL_EVENTS)]
        await run.prepared.store.append_events(run.response_id, fresh)
        return held

    @staticmethod
    async def _last_seq(store: EventLog, rid: str) -> int:
        last = await store.last_event(rid)
        return int(orjson.loads(last).get("sequence_number", -1)) if last else -1

    async def _save(self, run: ResponseRun, status: str) -> None:
        response = stored_body(run.response(status))  # type: ignore[arg-type]
        await run.prepared.store.save_response(StoredResponse(response=response), [])

    async def _renew(self, store: Jobs, rid: str, task: asyncio.Task[Any] | None) -> None:
        """Keep the lease; a lease lost (this gateway stalled) stops the run here. A cancel
        left in Redis stops it too: the bus message may have been missed (sent while this
        gateway was taking the run over, or lost with a NATS reconnect)."""
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                held = await store.renew(rid, self.owner, LEASE_MS)
                cancelled = held and await store.cancel_requested(rid)
            except Exception:  # Redis hiccup: try again next time
                log.warning("renewing the lease of %s failed", rid, exc_info=True)
                continue
            if cancelled:
                self._cancel(rid)
            elif not held and task is not None:
                log.warning("background response %s: lease lost; stopping here", rid)
                task.cancel()
                return

    # taking over ----------------------------------------------------------------------------
    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception:  # Redis down: the next sweep tries again
                log.warning("background sweep failed", exc_info=True)

    async def sweep(self) -> None:
        base = self.ctx.store
        for tenant, rid in await base.unclaimed(await base.running()):
            store = base.scoped(tenant)
            if rid in self.tasks or not await store.claim(rid, self.owner, LEASE_MS):
                continue
            try:
                await self.take_over(store, rid)
            except Exception:  # an unreadable job is dropped, loudly
                log.exception("background response %s could not be taken over", rid)
                await store.done_running(rid)

    async def take_over(self, store: ResponseStore, rid: str) -> None:
        raw = await store.get_job(rid)
        if raw is None:
            await store.done_running(rid)
            return
        job = Job.model_validate_json(raw)
        run = await self._rebuild(store, job)
        checkpoint_raw = await store.get_checkpoint(rid)
        checkpoint = RunCheckpoint.model_validate_json(checkpoint_raw) if checkpoint_raw else None
        turn = checkpoint.turn if checkpoint else 0
        parsed: list[ParseEvent] = []
        tokens: list[int] = []
        for entry in await store.steps(rid):
            step = LoggedStep.model_validate_json(entry)
            if step.turn == turn:
                parsed += step.parsed
                tokens += step.tokens
        log.warning(
            "background response %s: its gateway stopped; continuing it here (turn %d, %d tokens)",
            rid,
            turn,
            len(tokens),
        )
        run.observe()
        self._launch(run, Resume(checkpoint=checkpoint, parsed=parsed, tokens=tokens))

    async def _rebuild(self, store: ResponseStore, job: Job) -> ResponseRun:
        body = dict(job.request)
        for tool in body.get("tools") or []:
            sealed = job.credentials.get(tool.get("server_label", "")) if tool.get("type") == "mcp" else None
            if sealed:
                tool.update(orjson.loads(self.ctx.sealer.open(sealed, "tools")))
        req = ResponsesRequest.model_validate(body)
        context: list[ConversationItem] = []
        if req.previous_response_id:
            context = await store.history(req.previous_response_id) or []
        elif req.conversation_id:
            context = await store.conversation_items(req.conversation_id)
        inputs = await store.items(job.input_ids)
        prepared = Prepared(req, job.response_id, job.created_at, context, inputs, store)
        return ResponseRun(self.ctx, prepared, seal=self.ctx.sealer.seal)
