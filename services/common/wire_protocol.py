"""One connection to a NATS server as an asyncio protocol: its bytes read as frames for the
link's message and control handlers, its loss told to the link, and whether its socket takes
more (``writable``: cleared while the transport's buffer is over its high-water mark)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from services.common.nats_frames import FrameReader, OnMessage

log = logging.getLogger("chorus.wire")


class LinkProtocol(asyncio.Protocol):
    def __init__(
        self,
        on_message: OnMessage,
        on_control: Callable[[bytes], None],
        on_lost: Callable[[LinkProtocol, Exception | None], None],
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(on_message, on_control)
        self._on_lost = on_lost
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, but one

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
        except Exception as exc:  # noqa: BLE001 - a broken stream (or a bug reading it): drop it, reconnect
            log.warning("NATS stream unreadable (%s); reconnecting", exc)
            assert self.transport is not None
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        if not self.lost.done():
            self.lost.set_result(exc)
        self._on_lost(self, exc)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()
