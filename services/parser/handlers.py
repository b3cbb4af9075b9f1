"""The parser worker's sessions: token frames in, typed events out to the owning gateways.

One ``ParseSession`` per generation, opened by its first batch (which carries the parse spec
and any tokens an earlier attempt produced). Each batch's events go to the gateway with the
tokens they were parsed from; a batch that yields no event (text held back) sends nothing, its
tokens ride along with the next batch that does. Outgoing batches are coalesced per gateway."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import Span, SpanKind

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.generate import EventFrame, GatewayEvent, ParsedBatch, TokenBatch, TokenFrame
from contracts.messages.parse import Failed, ItemDelta, ParseEvent
from services.common import telemetry
from services.common.bus import Bus
from services.common.harmony import harmony_encoding
from services.common.metrics import RECOVERIES
from services.common.outbox import Outboxes
from services.parser.session import ParseSession

log = logging.getLogger("chorus.parser")


@dataclass
class _Open:
    session: ParseSession
    gateway: str  # instance id of the owning gateway
    span: Span  # the session, from its first batch to its end
    offset: int = 0  # tokens parsed so far
    unsent: list[int] = field(default_factory=list)  # parsed tokens not yet sent with events
    unsent_from: int = 0  # offset of unsent[0]
    touched: float = field(default_factory=time.monotonic)
    streaming: set[int] = field(default_factory=set)  # items whose text has started


class Sessions:
    """The worker's live sessions, keyed by generation id."""

    def __init__(self, bus: Bus, parser_id: str, *, window: float = 0.0) -> None:
        self.bus = bus
        self.parser_id = parser_id
        self._open: dict[str, _Open] = {}
        self.idle = asyncio.Event()  # no session open (draining waits for it)
        self.idle.set()
        self._opened = 0.0  # monotonic time the last session opened
        self._out: Outboxes[GatewayEvent, EventFrame] = Outboxes(
            bus, lambda items: EventFrame(events=merge(items)), window=window
        )

    def __len__(self) -> int:
        return len(self._open)

    # bus handlers ----------------------------------------------------------------------
    async def on_tokens(self, frame: TokenFrame) -> None:
        self.take(frame)

    def take(self, frame: TokenFrame) -> None:
        """``frame``'s batches, in order (a dispatcher in this process hands frames here)."""
        for batch in frame.batches:
            self._batch(batch)

    async def on_cancel(self, msg: Cancel) -> None:
        self._drop(msg.generation_id)

    async def on_death(self, service: str, instance: str) -> None:
        """A gateway died: nobody reads its sessions' events."""
        if service == "gateway":
            for gid in [g for g, e in self._open.items() if e.gateway == instance]:
                self._drop(gid)
            await self._out.forget(self.bus.subjects.gateway_events(instance))

    def _drop(self, gid: str) -> None:
        entry = self._open.pop(gid, None)
        if entry is not None:
            entry.span.end()
        if not self._open:
            self.idle.set()

    async def drain(self, quiet: float = 0.0, senders: Callable[[], bool] = lambda: True) -> None:
        """Until no session is open, none opened for ``quiet`` seconds (counted from now too: a
        gateway that chose this worker before hearing it drain still sends its generation here;
        not waited for once ``senders()`` says no gateway is left) and their last events are
        sent (before the "stopping" heartbeat, which the gateways would take for the death of
        the sessions not yet ended)."""
        self._opened = time.monotonic()  # the quiet period counts from now
        while True:
            await self.idle.wait()
            left = self._opened + quiet - time.monotonic()
            if self.idle.is_set() and (left <= 0 or not senders()):
                break
            await asyncio.sleep(min(max(left, 0.0), 0.05))
        await self._out.flush()

    async def close(self) -> None:
        await self._out.close()

    # the work ---------------------------------------------------------------------------
    def _batch(self, batch: TokenBatch) -> None:
        gid = batch.generation_id
        entry = self._open.get(gid)
        if entry is None:
            if batch.open is None:
                log.debug("tokens for unknown generation %s dropped", gid)
                return
            spec = batch.open
            session = ParseSession(
                harmony_encoding(), spec.request_id, spec.tool_names, spec.namespaces, spec.tool_schemas, spec.turn
            )
            span = telemetry.child_span(
                "parse", batch.trace, SpanKind.CONSUMER, **{"chorus.generation_id": gid, "chorus.turn": spec.turn}
            )
            entry = self._open[gid] = _Open(session, batch.gateway, span)
            self.idle.clear()
            self._opened = time.monotonic()
        entry.touched = time.monotonic()
        ids = batch.token_ids
        if batch.offset < entry.offset:  # already parsed (a repeated batch)
            ids = ids[entry.offset - batch.offset :]
        elif batch.offset > entry.offset:
            log.warning("generation %s: tokens %d..%d never arrived", gid, entry.offset, batch.offset)
            lost = BusError(
                code=ErrorCode.SERVICE_UNAVAILABLE, message="tokens were lost on the way to the parser", retryable=True
            )
            telemetry.failed(entry.span, lost.code.value, lost.message)
            self._end(gid, entry, [Failed(error=lost)])
            return
        events = entry.session.feed(ids) if ids else []
        if not entry.unsent:
            entry.unsent_from = entry.offset
        entry.unsent.extend(ids)
        entry.offset += len(ids)
        if batch.done:
            events += entry.session.finish(batch.finish_reason, batch.usage, batch.error, batch.stop_text)
            for kind, n in entry.session.recoveries.items():
                RECOVERIES.labels(kind).inc(n)
            entry.span.set_attributes(
                {"chorus.output_tokens": entry.offset, "chorus.recoveries": sum(entry.session.recoveries.values())}
            )
            if batch.finish_reason is not None:
                entry.span.set_attribute(telemetry.GEN_AI_RESPONSE_FINISH_REASONS, [batch.finish_reason])
            self._end(gid, entry, events)
        elif events:
            self._send(gid, entry, events)

    def _send(self, gid: str, entry: _Open, events: list[ParseEvent]) -> None:
        batch = ParsedBatch(
            generation_id=gid, offset=entry.unsent_from, token_ids=entry.unsent, events=events, parser=self.parser_id
        )
        entry.unsent = []
        entry.unsent_from = entry.offset
        # what starts or ends an item (and an item's first text) goes out at once; more text of
        # an item already streaming may wait for the next frame
        urgent = any(not isinstance(e, ItemDelta) or e.output_index not in entry.streaming for e in events)
        entry.streaming.update(e.output_index for e in events if isinstance(e, ItemDelta))
        self._out.put(self.bus.subjects.gateway_events(entry.gateway), batch, urgent=urgent)

    def _end(self, gid: str, entry: _Open, events: list[ParseEvent]) -> None:
        self._send(gid, entry, events)
        self._drop(gid)

    def expire(self, idle_s: float) -> int:
        now = time.monotonic()
        stale = [gid for gid, e in self._open.items() if now - e.touched > idle_s]
        for gid in stale:
            log.warning("generation %s: no tokens for %gs; session dropped", gid, idle_s)
            self._drop(gid)
        return len(stale)


def merge(events: list[GatewayEvent]) -> list[GatewayEvent]:
    """Batches of the same generation that piled up in the outbox, merged into one."""
    out: dict[str, GatewayEvent] = {}
    for event in events:
        held = out.get(event.generation_id)
        if isinstance(held, ParsedBatch) and isinstance(event, ParsedBatch):
            out[event.generation_id] = ParsedBatch(
                generation_id=held.generation_id,
                offset=held.offset,
                parser=held.parser,
                token_ids=[*held.token_ids, *event.token_ids],
                events=join_deltas([*held.events, *event.events]),
            )
        elif held is None:
            out[event.generation_id] = event
        else:
            out[f"{event.generation_id}#{len(out)}"] = event
    return list(out.values())


def join_deltas(events: list[ParseEvent]) -> list[ParseEvent]:
    """Neighbouring text deltas of one item as one."""
    out: list[ParseEvent] = []
    for event in events:
        prev = out[-1] if out else None
        if isinstance(event, ItemDelta) and isinstance(prev, ItemDelta) and prev.output_index == event.output_index:
            out[-1] = ItemDelta(output_index=prev.output_index, delta=prev.delta + event.delta)
        else:
            out.append(event)
    return out
