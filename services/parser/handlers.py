"""parser handlers: ParseOpen (faststream request/reply) and the token stream (raw nats-py,
the hot path: one message per engine batch, no framework cost per message)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from prometheus_client import Counter

from contracts.messages.control import Cancel
from contracts.messages.generate import TokenBatch
from contracts.messages.parse import ParsedBatch, ParseOpen, ParseOpened
from contracts.subjects import REQUEST_ID_HEADER
from services.common import bus
from services.common.harmony import harmony_encoding
from services.parser.session import ParseSession

log = logging.getLogger("chorus.parser")
RECOVERIES = Counter("chorus_parser_recoveries_total", "Malformed model output repaired, by kind", ["kind"])


@dataclass
class _Open:
    session: ParseSession
    events_subject: str
    next_seq: int = 0  # the next TokenBatch seq expected
    out_seq: int = 0  # the next ParsedBatch seq to send
    touched: float = field(default_factory=time.monotonic)


class Sessions:
    """The worker's live sessions, keyed by request id."""

    def __init__(self, nc: NatsClient | None, worker_id: str, token_subject: str) -> None:
        self.nc = nc
        self.worker_id = worker_id
        self.token_subject = token_subject
        self._open: dict[str, _Open] = {}

    def __len__(self) -> int:
        return len(self._open)

    def open(self, req: ParseOpen) -> ParseOpened:
        session = ParseSession(harmony_encoding(), req.request_id, req.tool_names, req.namespaces,
                               req.tool_schemas, req.turn)
        self._open[req.request_id] = _Open(session, req.events_subject)
        return ParseOpened(worker_id=self.worker_id, token_subject=self.token_subject)

    async def cancel(self, msg: Cancel) -> None:
        """End the session as aborted, so a gateway still listening (a cancelled background
        response) learns at once; one that has gone away simply ignores it."""
        entry = self._open.pop(msg.request_id, None)
        if entry is None:
            return
        events = entry.session.finish("abort", None, None)
        await self._publish(msg.request_id, entry, events)

    async def _publish(self, request_id: str, entry: _Open, events: list) -> None:  # type: ignore[type-arg]
        out = ParsedBatch(request_id=request_id, seq=entry.out_seq, events=events)
        entry.out_seq += 1
        assert self.nc is not None
        await self.nc.publish(entry.events_subject, bus.dump(out), headers={REQUEST_ID_HEADER: request_id})

    async def on_tokens(self, msg: Msg) -> None:
        try:
            batch = TokenBatch.model_validate_json(msg.data)
        except ValueError:
            log.warning("unreadable token batch dropped")
            return
        entry = self._open.get(batch.request_id)
        if entry is None:
            log.debug("tokens for unknown request %s dropped", batch.request_id)
            return
        if batch.seq != entry.next_seq:
            log.warning("request %s: token batch %d, expected %d", batch.request_id, batch.seq, entry.next_seq)
        entry.next_seq = batch.seq + 1
        entry.touched = time.monotonic()
        events = entry.session.feed(batch.token_ids)
        if batch.done:
            events += entry.session.finish(batch.finish_reason, batch.usage, batch.error)
            self._open.pop(batch.request_id, None)
            for kind, n in entry.session.recoveries.items():
                RECOVERIES.labels(kind).inc(n)
        if not events and not batch.done:
            return
        await self._publish(batch.request_id, entry, events)

    def expire(self, idle_s: float) -> int:
        now = time.monotonic()
        stale = [rid for rid, e in self._open.items() if now - e.touched > idle_s]
        for rid in stale:
            self._open.pop(rid, None)
        return len(stale)
