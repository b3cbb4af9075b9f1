"""The simulated engine's KV cache events, published as vLLM's ``ZmqEventPublisher`` publishes
them: ``[topic, seq (8 bytes, big-endian), payload]`` on a PUB socket, one batch per call, seq
counting from 0; and a ROUTER socket keeping the last ``buffer_steps`` batches for subscribers
that missed some: a request ``[b"", start seq (8 bytes)]`` (a DEALER's, or a REQ's) is answered
with every kept batch from that seq on, one message ``[b"", seq, payload]`` each, then
``[b"", seq -1, b""]``.

The PUB side is an XPUB socket (the same wire to a subscriber): it also hears subscriptions,
so a test can wait until its subscriber is connected instead of losing the first batches."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from services.common.kv_events import END_SEQ, EventBatch, KvEvent, WireForm, encode_batch

if TYPE_CHECKING:
    from services.simengine.settings import Settings
    from services.simengine.state import PrefixCache

logger = logging.getLogger(__name__)


class KvPublisher:
    """``start()`` binds the sockets (raises ``zmq.ZMQError`` if it cannot); run ``serve()`` in
    the owner's task group to answer replay requests and hear subscriptions; ``publish()`` from
    anywhere on the loop; ``close()`` (idempotent) ends ``serve()`` and has freed the ports when
    it returns (a restarted engine binds them again at once).
    ``endpoint`` and ``replay_endpoint`` are the bound addresses once started (a ``*`` port
    resolved). ``data_parallel_rank`` is written in every batch, as vLLM does (None: not set)."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        form: WireForm = "map",
        *,
        data_parallel_rank: int | None = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
    ) -> None:
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.topic, self.form, self.data_parallel_rank = topic.encode(), form, data_parallel_rank
        self.next_seq = 0
        self.subscriptions = 0
        self._hwm = hwm
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._subscribed = asyncio.Event()
        self._closed = asyncio.Event()

    def start(self) -> None:
        # a context of its own: close() terminates it, which returns once the ports are free
        ctx = self._ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.XPUB)
        try:
            pub.setsockopt(zmq.SNDHWM, self._hwm)
            pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe and unsubscribe, not only the first
            pub.bind(self.endpoint)
            self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            if self.replay_endpoint is not None:
                replay = ctx.socket(zmq.ROUTER)
                self._replay = replay
                replay.bind(self.replay_endpoint)
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError:
            pub.close(linger=0)
            self.close()
            raise
        self._pub = pub
        logger.info("KV cache events on %s (replay: %s, form: %s)", self.endpoint, self.replay_endpoint, self.form)

    async def serve(self) -> None:
        """Answer replay requests and note subscriptions until ``close()``."""
        if self._pub is None:
            raise RuntimeError("KvPublisher.serve() before start()")
        try:
            async with asyncio.TaskGroup() as tg:
                loops = [tg.create_task(self._note_subscriptions(self._pub))]
                if self._replay is not None:
                    loops.append(tg.create_task(self._answer_replays(self._replay)))
                await self._closed.wait()
                for loop in loops:
                    loop.cancel()
        finally:
            self.close()

    def close(self) -> None:
        self._closed.set()
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def wait_for_subscriber(self) -> None:
        """Until at least one subscriber's subscription has arrived (batches published from
        then on reach it)."""
        await self._subscribed.wait()

    def publish(self, events: Sequence[KvEvent], *, lost: bool = False) -> int | None:
        """Publish ``events`` as one batch; its seq (None: nothing to send, or not started).
        ``lost``: number and keep it for replay without sending it, as a batch a subscriber
        missed (fault injection)."""
        if not events or self._pub is None:
            return None
        batch = EventBatch(time.time(), tuple(events), self.data_parallel_rank)
        return self.publish_payload(encode_batch(batch, self.form), lost=lost)

    def publish_payload(self, payload: bytes, *, lost: bool = False) -> int | None:
        """Publish an encoded batch (or any bytes: a test's garbage) under the next seq."""
        if self._pub is None:
            return None
        seq = self.next_seq
        self.next_seq += 1
        self._buffer.append((seq, payload))
        if not lost:
            # never blocks: a PUB socket drops for a subscriber at its high-water mark
            sent: Any = self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
            if isinstance(sent, asyncio.Future):
                sent.add_done_callback(_log_send_failure)
        return seq

    async def _note_subscriptions(self, pub: zmq.asyncio.Socket) -> None:
        while True:
            frame = await pub.recv()
            if frame[:1] == b"\x01":
                self.subscriptions += 1
            elif frame[:1] == b"\x00":
                self.subscriptions = max(0, self.subscriptions - 1)
            if self.subscriptions:
                self._subscribed.set()
            else:
                self._subscribed.clear()

    async def _answer_replays(self, replay: zmq.asyncio.Socket) -> None:
        while True:
            frames = await replay.recv_multipart()
            if len(frames) == 3 and frames[1] == b"":
                client, delimiter, start = frames[0], [b""], frames[2]
            elif len(frames) == 2:
                client, delimiter, start = frames[0], [], frames[1]
            else:
                logger.warning("KV events replay: a request of %d frames ignored", len(frames))
                continue
            if len(start) != 8:
                logger.warning("KV events replay: a start seq of %d bytes ignored", len(start))
                continue
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await replay.send_multipart([client, *delimiter, seq.to_bytes(8, "big"), payload])
            await replay.send_multipart([client, *delimiter, END_SEQ, b""])


def _log_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        logger.warning("KV events: a batch was not sent: %s", sent.exception())


def start_kv_events(settings: Settings, cache: PrefixCache) -> KvPublisher | None:
    """The simulator's publisher, started, with ``cache``'s events going to it; None when
    ``kv_events_endpoint`` is unset. The caller runs ``serve()`` in its task group and calls
    ``close()`` on shutdown. Build ``cache`` from ``kv_cache_tokens`` and ``kv_block_size``."""
    if settings.kv_events_endpoint is None:
        return None
    publisher = KvPublisher(
        settings.kv_events_endpoint,
        settings.kv_events_replay_endpoint,
        settings.kv_events_topic,
        settings.kv_events_form,
    )
    publisher.start()
    cache.on_events = publisher.publish
    return publisher
