"""One Responses API request, from its conversation to its final ``Response`` object.

Every transport (a JSON answer, an SSE stream, a background job, a WebSocket) drives the same
``ResponseRun``: ``events()`` yields typed stream events in batches (one per parser batch),
``response()`` is the object at any moment. A run loops over model turns so the tool loop can
feed results back; usage and ``max_output_tokens`` count over the whole response. The request
is checked and its context loaded before (prepare.py); what each model turn asks the engine
for is turn_spec.py's business."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompactionCompactingEvent,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
)

from contracts.errors import BusError
from contracts.messages.items import CompactionItem, ConversationItem, MessageItem
from contracts.messages.parse import Failed, Finished, ParseEvent, Usage
from services.common import telemetry
from services.common.errors import ChorusError
from services.gateway import structured
from services.gateway.context import GatewayContext
from services.gateway.errors import ABORTED, STORAGE_DOWN, public
from services.gateway.generation import Generation, GenerationSpec, RenderedPrompt, Replayed
from services.gateway.observe import Observed, current
from services.gateway.responses.compaction import estimated_tokens, read_summary, summary_generation, visible
from services.gateway.responses.events import Event, EventWriter
from services.gateway.responses.items import new_id
from services.gateway.responses.output import ItemView, Output
from services.gateway.responses.prepare import Prepared
from services.gateway.responses.request import ResponsesRequest
from services.gateway.responses.response import Status, build_response
from services.gateway.responses.steps import Resume, RunCheckpoint, Step, added
from services.gateway.responses.tool_loop import ToolLoop
from services.gateway.responses.turn_spec import response_format, turn_spec

RunStatus = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]


@dataclass
class ResponseRun:
    ctx: GatewayContext
    prepared: Prepared
    seal: Callable[[str], str] | None = None
    output: Output = field(default_factory=Output)
    usage: Usage = field(default_factory=Usage)
    status: RunStatus = "in_progress"
    error: dict[str, str] | None = None
    incomplete_reason: str | None = None
    finish_reasons: list[str] = field(default_factory=list)  # each model turn's, for the trace
    observed: Observed | None = None  # metrics, the span and the log line of the request
    refused: BusError | None = None  # the engine refused the request before any output
    remember: bool = False  # a later response may continue this one's prompt (a WebSocket's)
    rendered: RenderedPrompt | None = None  # the last model turn's prompt, as its worker keeps it
    completed_at: int | None = None  # stamped once: the returned, streamed and stored objects agree

    def __post_init__(self) -> None:
        req = self.request
        self.tools = ToolLoop.for_request(self.ctx, self.response_id, req.mcp_tools(), req.max_tool_calls)
        wants_sealed = bool(req.include and "reasoning.encrypted_content" in req.include)
        self.view = ItemView(
            seal=self.seal if wants_sealed else None, summary=bool(req.reasoning and req.reasoning.wants_summary)
        )
        self.writer = EventWriter(self.output, self.view)

    @property
    def request(self) -> ResponsesRequest:
        return self.prepared.request

    @property
    def response_id(self) -> str:
        return self.prepared.response_id

    # -- the response object -------------------------------------------------------------
    def response(self, status: Status | None = None) -> Response:
        status = status or self.status
        if status == "completed" and self.completed_at is None:
            self.completed_at = int(time.time())
        return build_response(
            self.request,
            response_id=self.response_id,
            created_at=self.prepared.created_at,
            status=status,
            completed_at=self.completed_at,
            output=[self.view.json(i) for i in self.output.items],
            usage=self.usage,
            error=self.error,
            incomplete_reason=self.incomplete_reason,
        )

    def conversation(self) -> list[ConversationItem]:
        """Everything the next turn builds on: context, this input, this output (with tool
        results)."""
        out: list[ConversationItem] = [*self.prepared.context, *self.prepared.inputs]
        for index, item in self.output.indexed():
            out.extend(self.tools.history.get(index, [item]))
        return out

    # -- generation -----------------------------------------------------------------------
    def observe(self, request: Any = None) -> Observed:
        """Start observing the run (the transport that runs it passes its HTTP request)."""
        req = self.request
        self.observed = Observed.start(
            request,
            api="responses",
            model=req.model,
            request_id=self.response_id,
            stream=bool(req.stream or req.background),
            max_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
        )
        return self.observed

    def _spec(self, turn: int, trace: dict[str, str] | None = None) -> GenerationSpec | None:
        return turn_spec(
            self.ctx,
            self.request,
            request_id=self.response_id,
            turn=turn,
            items=visible(self.conversation()),
            mcp_namespaces=self.tools.mcp.namespaces() if self.tools.mcp is not None else [],
            completion_tokens=self.usage.completion_tokens,
            trace=trace,
            # a tool loop's next turn, or the next response on the socket, renders only its new items
            remember=self.remember or self.tools.mcp is not None,
            after=self.rendered,
        )

    async def events(self) -> AsyncIterator[list[Event]]:
        """The whole response as event batches. Failures before the first model turn starts
        raise (the HTTP layer answers with a status code); later ones end it as failed."""
        async for step in self.steps():
            if step.events:
                yield step.events

    async def steps(self, resume: Resume | None = None) -> AsyncGenerator[Step, None]:
        """``events`` with what a replica needs to take the run over: a checkpoint before each
        model turn, then the parse events and tokens behind each batch. With ``resume`` the run
        continues from a checkpoint and the turn's parse events and tokens already logged
        (events it had already sent come again, numbered the same: the caller drops them)."""
        w = self.writer
        first = 0
        await self.prepared.storage_ready()  # a stored response: storage answers before any other work
        if resume is not None and resume.checkpoint is not None and resume.checkpoint.turn > 0:
            first = resume.checkpoint.turn
            with current(self.observed):
                await self.tools.relist()  # what the tools are, without new listing items
            self.usage = resume.checkpoint.restore(self.output, self.tools)
            prelude: list[Event] = []
        else:
            with current(self.observed):  # the tool calls' spans belong to this request's trace
                prelude = await self.tools.prelude(w, self.prepared.context, self.prepared.inputs)
        if self.tools.mcp is not None:
            self.view.mcp_labels = frozenset(self.tools.labels)
            self.view.needs_approval = self.tools.mcp.needs_approval
            if first == 0:
                self.output.next_turn()
        opened = first > 0  # a run taken over after its first turn has sent its opening
        for turn in range(first, self.ctx.settings.max_tool_iterations):
            if self._over_threshold() or (turn == 0 and self.request.compact_now):
                async for events in self._compact(self._opening(prelude) if not opened else []):
                    yield Step(events, turn=turn)
                opened = True
                if self.request.compact_now or self.status != "in_progress":
                    break
            turn_span = telemetry.child_span(
                "responses.turn", self.observed.span if self.observed else None, **{"chorus.turn": turn}
            )
            spec = self._spec(turn, telemetry.carrier_of(turn_span))
            if spec is None:
                turn_span.end()
                self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
                break
            checkpoint = RunCheckpoint.taken(turn, self.output, self.usage, self.tools)
            replayed = None
            if resume is not None and turn == first and resume.tokens:
                replayed = Replayed(tokens=resume.tokens, events=resume.parsed)
            opening = self._opening(prelude) if not opened else []
            opened = True
            if replayed is not None and any(isinstance(e, Finished | Failed) for e in replayed.events):
                # the turn had ended before the takeover: its events again (the caller drops
                # those a follower has; the ones logged but never sent go out now)
                yield Step(opening + self._apply(replayed.events), checkpoint=checkpoint, turn=turn)
            else:
                try:
                    async with self.ctx.generations.open(spec, resume=replayed) as generation:
                        # the logged batches again: the writer's state and numbering as they were,
                        # and the events of a batch logged just before its sender died
                        replay = self._apply(replayed.events) if replayed is not None else []
                        yield Step(opening + replay, checkpoint=checkpoint, turn=turn)
                        async for step in self._turn(generation, turn):
                            yield step
                        self.rendered = generation.rendered
                except Exception as exc:
                    if turn == 0 and resume is None:
                        raise
                    error = getattr(exc, "error", None)
                    self.fail(getattr(error, "message", None) or "the model turn failed")
                finally:
                    turn_span.end()
            if self.status != "in_progress":
                break
            with current(self.observed):
                again, events = await self.tools.after_turn(w)
            if events:
                yield Step(events, turn=turn)
            if not again:
                break
            self.output.next_turn()
        if leftovers := self.tools.finish(w):
            yield Step(leftovers)
        if self.status == "in_progress":
            self.status = "completed"
            self._check_format()
        yield Step([self.final_event()])

    # -- compaction ---------------------------------------------------------------------------
    def _over_threshold(self) -> bool:
        threshold = self.request.compact_threshold
        return (
            threshold is not None
            and estimated_tokens(visible(self.conversation()), self.request.instructions) >= threshold
        )

    async def _compact(self, opening: list[Event]) -> AsyncIterator[list[Event]]:
        """The conversation so far condensed into a compaction item (an output item): later
        turns read its summary instead of what it stands for."""
        w = self.writer
        item_id = new_id("cmp")
        index = self.output.next_index
        started = False
        try:
            async with summary_generation(
                self.ctx,
                model=self.request.model,
                items=visible(self.conversation()),
                instructions=self.request.instructions,
                request_id=item_id,
                trace=telemetry.carrier_of(self.observed.span) if self.observed else None,
            ) as generation:
                # like a model turn, nothing is sent before an engine took it: a conversation
                # too long for the model is the caller's 400, not a failed response
                started = True
                yield [
                    *opening,
                    ResponseCompactionCompactingEvent(
                        type="response.compaction.compacting",
                        item_id=item_id,
                        output_index=index,
                        sequence_number=w.seq(),
                    ),
                ]
                summary, usage = await read_summary(generation)
        except ChorusError as exc:
            if started or not opening or exc.error.code.http_status >= 500:
                self.fail(f"Compacting the conversation failed: {public(exc.error).message}")
                return
            raise
        self._add_usage(usage)
        item = CompactionItem(summary=summary, id=item_id, sealed=self.seal(summary) if self.seal else None)
        events = w.add_item(item)
        self.output.next_turn()
        yield events

    async def _turn(self, generation: Generation, turn: int) -> AsyncIterator[Step]:
        known = len(generation.tokens)
        async for batch in generation.batches():
            out = self._apply(batch)
            tokens = generation.tokens[known:]
            known = len(generation.tokens)
            yield Step(out, parsed=batch, tokens=tokens, turn=turn)
            seen = self.observed
            if seen is not None and seen.first is None and any(e.type.endswith(".delta") for e in out):
                seen.first_output()  # once the first text is on its way (off its path)

    def _opening(self, prelude: list[Event]) -> list[Event]:
        """created and in_progress, then what came before the first turn (MCP listings)."""
        w = self.writer
        return w.renumber(
            [
                ResponseCreatedEvent(
                    type="response.created", sequence_number=w.seq(), response=self.response("in_progress")
                ),
                ResponseInProgressEvent(
                    type="response.in_progress", sequence_number=w.seq(), response=self.response("in_progress")
                ),
                *prelude,
            ]
        )

    def _apply(self, batch: list[ParseEvent]) -> list[Event]:
        """A parser batch -> stream events, and what ends the turn (usage, status)."""
        w = self.writer
        out: list[Event] = []
        for event in batch:
            if isinstance(event, Finished):
                self._add_usage(event.usage)
                self.finish_reasons.append(event.finish_reason)
                out += w.close_open()
                if event.finish_reason == "length":
                    self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
                elif event.finish_reason == "abort":  # no incomplete reason says it: a failure
                    self.fail(ABORTED.message)
            elif isinstance(event, Failed):
                self._add_usage(event.usage)
                out += w.close_open()
                self.fail(public(event.error).message)
                if not self.output.done and event.error.code.http_status < 500:
                    self.refused = event.error  # the engine refused the request itself
            else:
                out += w.handle(event)
        return out

    def _add_usage(self, u: Usage) -> None:
        self.usage = added(self.usage, u)

    def fail(self, message: str, code: str = "server_error") -> None:
        self.status = "failed"
        self.error = {"code": code, "message": message}

    def cancelled(self) -> list[Event]:
        """The run was stopped by a cancel: what the stream ends with."""
        self.status = "cancelled"
        return [*self.writer.close_open(), self.final_event()]

    def _check_format(self) -> None:
        """The final answer against text.format (the engine's grammar should have made it so)."""
        fmt = response_format(self.request)
        answers = [i for i in self.output.items if isinstance(i, MessageItem) and i.channel in (None, "final")]
        if fmt is None or not answers:
            return
        why = structured.check(answers[-1].content, fmt)
        if why is not None:
            self.fail(f"The model's answer did not follow text.format: {why}")

    def storage_failed(self, terminal: Event) -> Event:
        """What replaces ``terminal`` (numbered the same) when the response could not be stored
        (Redis down): failed, with the spec's ``server_error`` code (a response's error codes
        are a closed set) and a message that says storage was the cause. The run's metrics
        stay the model's outcome; its log line says what the client got."""
        message = f"{STORAGE_DOWN.message} This response was not stored ({STORAGE_DOWN.code.value})."
        self.fail(message)
        if self.observed is not None:
            self.observed.notes.update(outcome="failed", reason=message)
        seq = getattr(terminal, "sequence_number", self.writer.seq())
        return ResponseFailedEvent(type="response.failed", sequence_number=seq, response=self.response())

    def broken(self, message: str) -> Event:
        """The spec's ``error`` event for a stream that cannot go on (the next sequence number)."""
        self.status = "failed"
        if self.observed is not None:
            self.observed.finish(outcome="failed", usage=self.usage, error=message)
        return ResponseErrorEvent(
            type="error", code="server_error", message=message, param=None, sequence_number=self.writer.seq()
        )

    def final_event(self) -> Event:
        if self.observed is not None:
            self.observed.finish(
                outcome=self.status,
                usage=self.usage,
                finish_reasons=self.finish_reasons or ["error"],
                error=self.error["message"] if self.error else None,
            )
        response = self.response()
        seq = self.writer.seq()
        if self.status == "completed":
            return ResponseCompletedEvent(type="response.completed", sequence_number=seq, response=response)
        if self.status == "incomplete":
            return ResponseIncompleteEvent(type="response.incomplete", sequence_number=seq, response=response)
        # the stream protocol has no "cancelled" event: a cancelled response ends with
        # response.failed whose response.status says "cancelled"
        return ResponseFailedEvent(type="response.failed", sequence_number=seq, response=response)
