"""One engine's KV cache events, read from its ZMQ publisher (vLLM's ``--kv-events-config``,
SGLang's ``--kv-events-config``) and handed on in order.

Every message is ``[topic, seq, payload]``; ``seq`` counts the engine's batches from 0. A
batch that follows the last one is decoded and handed to ``on_batch(seq, batch)``. A gap (PUB
sockets drop for slow subscribers, and nothing arrives while reconnecting) is filled from the
engine's replay socket when there is one; when it cannot be (no replay socket, the batches no
longer kept, no answer), the engine's view is lost: ``on_reset(reason)``, and the view starts
again from the batch at hand. So does a seq going back (the engine restarted: its cache is
empty) and ``max_decode_errors`` undecodable batches in a row. A single undecodable batch or an
event of an unknown type is logged (at most every ``LOG_EVERY_S``) and counted, not fatal.

Silence is not a fault: an idle vLLM sends nothing. ``last_event_age`` tells the caller how
long it has been; ``silent`` whether longer than ``silence_s``. A dead connection is noticed by
ZMTP heartbeats and reconnected by ZMQ itself; a socket error is retried after a pause."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

import zmq
import zmq.asyncio

from services.common.kv_events import END_SEQ, EventBatch, KvDecodeError, decode_batch
from services.common.metrics import KV_EVENTS

log = logging.getLogger("chorus.dispatcher.kv_events")

LOG_EVERY_S = 10.0
RETRY_S = 1.0
REPLAY_ALL = 1 << 63  # "before" no batch: every batch the engine keeps
JOIN_WAIT_S = 0.5  # silence on joining after which the kept batches are asked for


class KvSubscriber:
    """``run(stop)`` until ``stop`` is set (or the task is cancelled); it raises nothing else.
    ``engine`` labels the metrics and logs (default: the endpoint). ``counts`` holds the same
    outcomes as the ``chorus_kv_events_total`` family. With ``catch_up`` (and a replay socket),
    the batches an engine kept from before the subscriber joined are asked for as it connects,
    and those of a restarted engine's first moments with its first batch after, so the view
    does not start empty."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None,
        on_batch: Callable[[int, EventBatch], object],
        on_reset: Callable[[str], object],
        *,
        silence_s: float,
        engine: str | None = None,
        replay_timeout_s: float = 2.0,
        max_decode_errors: int = 3,
        catch_up: bool = True,
        heartbeat_s: float = 2.0,
    ) -> None:
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.on_batch, self.on_reset = on_batch, on_reset
        self.silence_s, self.replay_timeout_s = silence_s, replay_timeout_s
        self.max_decode_errors, self.catch_up, self.heartbeat_s = max_decode_errors, catch_up, heartbeat_s
        self.engine = engine or endpoint
        self.last_seq: int | None = None
        self.counts: Counter[str] = Counter()
        self._last_message_at: float | None = None
        self._decode_errors_in_row = 0
        self._silence_noted = False
        self._joining = True  # the next batch is the first from this engine (run) we see
        self._replayed_through: int | None = None  # the last batch the joining replay brought
        self._asked = False  # the kept batches were asked for on joining
        self._logged_at: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    @property
    def last_event_age(self) -> float | None:
        """Seconds since the last message from the engine (None: none yet)."""
        return None if self._last_message_at is None else time.monotonic() - self._last_message_at

    @property
    def silent(self) -> bool:
        """Nothing for longer than ``silence_s`` (an idle engine looks the same as a gone one)."""
        age = self.last_event_age
        return age is None or age > self.silence_s

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            reading = tg.create_task(self._read_forever())
            await stop.wait()
            reading.cancel()

    async def _read_forever(self) -> None:
        while True:
            try:
                await self._read()
            except (zmq.ZMQError, OSError) as exc:
                self._count("socket_error")
                self._log("socket", logging.WARNING, "KV events from %s: %s; reconnecting", self.engine, exc)
            except Exception:
                self._count("socket_error")
                log.exception("KV events from %s: reading failed; reconnecting", self.engine)
            await asyncio.sleep(RETRY_S)

    async def _read(self) -> None:
        sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.RCVHWM, 100_000)
            ivl = max(1, int(self.heartbeat_s * 1000))
            sub.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(self.endpoint)
            while True:
                # joining: a first batch soon asks for the kept ones; an idle engine sends none, so
                # a moment's silence asks for them too (a request routed meanwhile sees nothing)
                joining = self._joining and not self._asked and self.catch_up and self.replay_endpoint is not None
                try:
                    frames = await asyncio.wait_for(sub.recv_multipart(), JOIN_WAIT_S if joining else self.silence_s)
                except TimeoutError:
                    if joining and self.last_seq is None:
                        self._asked = True
                        await self._replay(0, REPLAY_ALL, strict=False)
                        self._replayed_through = self.last_seq
                        continue
                    if not self._silence_noted:  # once per silence: an idle engine is no news
                        self._silence_noted = True
                        log.info("KV events from %s: none for %.0fs (idle, or gone)", self.engine, self.silence_s)
                    continue
                self._silence_noted = False
                await self._on_message(frames)
        finally:
            sub.close(linger=0)

    async def _on_message(self, frames: list[bytes]) -> None:
        self._last_message_at = time.monotonic()
        if len(frames) != 3 or len(frames[1]) != 8:
            self._undecodable(None, f"a message of {len(frames)} frames, not [topic, seq, payload]")
            return
        _topic, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big")
        last = self.last_seq
        if last is not None and seq <= last:
            if self._replayed_through is not None and seq <= self._replayed_through:
                return  # published as we joined: the replay brought it already
            self._count("restart")
            self._reset(f"sequence went back from {last} to {seq}: the engine restarted")
            self._joining, last = True, None
        if last is None:
            # the engine's first batches (from before we joined, or its restart) are worth
            # replaying; after a gap or garbage the kept batches would bring the same trouble
            if self._joining and seq > 0 and self.catch_up and self.replay_endpoint is not None:
                await self._replay(0, seq, strict=False)
        elif seq > last + 1:
            self._count("gap")
            missed = f"batches {last + 1}..{seq - 1} missed"
            if self.replay_endpoint is None:
                self._reset(f"{missed} and no replay socket")
            elif not await self._replay(last + 1, seq, strict=True):
                self._reset(f"{missed} and not replayed")
        self._joining = False
        self._replayed_through = None
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes, outcome: str = "applied") -> None:
        self.last_seq = seq
        try:
            decoded = decode_batch(payload)
        except KvDecodeError as exc:
            self._undecodable(seq, str(exc))
            return
        self._decode_errors_in_row = 0
        if decoded.unknown:
            self._count("unknown", decoded.unknown)
            self._log("unknown", logging.WARNING, "KV events from %s: skipped %s", self.engine, decoded.unknown_tags)
        self._count(outcome, 1 if outcome == "replayed" else len(decoded.batch.events))
        try:
            self.on_batch(seq, decoded.batch)
        except Exception:
            log.exception("KV events from %s: the consumer failed on batch %d", self.engine, seq)

    def _undecodable(self, seq: int | None, why: str) -> None:
        self._count("undecodable")
        self._decode_errors_in_row += 1
        self._log("undecodable", logging.WARNING, "KV events from %s: batch %s undecodable: %s", self.engine, seq, why)
        if self._decode_errors_in_row >= self.max_decode_errors:
            self._decode_errors_in_row = 0
            self._reset(f"{self.max_decode_errors} undecodable batches in a row")

    def _reset(self, reason: str) -> None:
        self._count("reset")
        self.last_seq = None
        log.warning("KV events from %s: view dropped: %s", self.engine, reason)
        try:
            self.on_reset(reason)
        except Exception:
            log.exception("KV events from %s: the consumer failed on a reset", self.engine)

    async def _replay(self, start: int, before: int, *, strict: bool) -> bool:
        """Apply the kept batches ``start``..``before - 1`` in order; whether they all came
        (``strict``: from ``start`` exactly, else from the oldest kept)."""
        assert self.replay_endpoint is not None
        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)  # one per replay: no stale answers
        try:
            dealer.connect(self.replay_endpoint)
            async with asyncio.timeout(self.replay_timeout_s):
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    if frames[:1] == [b""]:
                        frames = frames[1:]  # the delimiter a REQ-style request gets back
                    if len(frames) != 2 or frames[0] == END_SEQ or len(frames[0]) != 8:
                        break
                    seq = int.from_bytes(frames[0], "big")
                    if seq >= before:
                        break
                    if self.last_seq is not None and seq <= self.last_seq:
                        continue
                    if strict and seq != (start if self.last_seq is None else self.last_seq + 1):
                        break  # the engine no longer keeps the first ones
                    self._apply(seq, frames[1], "replayed")
                    if self.last_seq is None:
                        return True  # dropped on the way (undecodable batches): it starts again anyway
        except TimeoutError:
            self._log("replay", logging.WARNING, "KV events from %s: no replay answer", self.engine)
        except zmq.ZMQError as exc:
            self._log("replay", logging.WARNING, "KV events from %s: replay failed: %s", self.engine, exc)
        finally:
            dealer.close(linger=0)
        return not strict or self.last_seq == before - 1

    def _count(self, outcome: str, n: int = 1) -> None:
        if n:
            self.counts[outcome] += n
            KV_EVENTS.labels(engine=self.engine, outcome=outcome).inc(n)

    def _log(self, kind: str, level: int, message: str, *args: object) -> None:
        """At most one line per kind every LOG_EVERY_S; the lines held back are counted in it."""
        now = time.monotonic()
        if now - self._logged_at.get(kind, -LOG_EVERY_S) < LOG_EVERY_S:
            self._suppressed[kind] += 1
            return
        self._logged_at[kind] = now
        held = self._suppressed.pop(kind, 0)
        with contextlib.suppress(TypeError, ValueError):
            message = message % args
        log.log(level, "%s%s", message, f" ({held} more like it not logged)" if held else "")
