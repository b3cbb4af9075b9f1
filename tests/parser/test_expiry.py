"""A parser worker drops the sessions whose tokens stopped coming (their dispatcher and gateway
are gone), and says when it holds none (draining waits for that)."""

from __future__ import annotations

import asyncio
from typing import cast

from pydantic import BaseModel

from contracts.messages.generate import ParseSpec, TokenBatch, TokenFrame
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.parser.handlers import Sessions


class NoBus:
    """A session that produced no events sends nothing: nothing here is ever called."""


async def test_idle_sessions_expire_and_the_worker_becomes_idle() -> None:
    sessions = Sessions(cast(Bus, NoBus()), "w1")
    opening = TokenBatch(generation_id="g1", offset=0, token_ids=[], open=ParseSpec(request_id="r1"), gateway="gw")
    await sessions.on_tokens(TokenFrame(batches=[opening]))
    assert len(sessions) == 1 and not sessions.idle.is_set()
    assert sessions.expire(60.0) == 0  # recently touched: kept
    await asyncio.sleep(0.05)  # a sleep, not a wait: the session's idle time is what expiry reads
    assert sessions.expire(0.01) == 1
    assert len(sessions) == 0 and sessions.idle.is_set()
    # tokens for the expired generation are dropped, not a new session
    await sessions.on_tokens(TokenFrame(batches=[TokenBatch(generation_id="g1", offset=0, token_ids=[1, 2])]))
    assert len(sessions) == 0


class SentBus:
    """Records what the worker sends."""

    def __init__(self) -> None:
        self.subjects = Subjects("t")
        self.sent: list[tuple[str, BaseModel | bytes]] = []
        self.sends_nowait = True

    async def publish(self, subject: str, msg: BaseModel | bytes, headers: dict[str, str] | None = None) -> None:
        self.sent.append((subject, msg))

    def publish_nowait(self, subject: str, msg: BaseModel) -> bool:
        self.sent.append((subject, msg))
        return True


async def test_draining_waits_for_a_quiet_moment_and_finishes_late_generations() -> None:
    """Idle is not enough: a gateway that chose this worker before hearing it drain still sends
    its generation here, and that generation is finished and sent before the drain ends."""
    bus = SentBus()
    sessions = Sessions(cast(Bus, bus), "w1")
    draining = asyncio.create_task(sessions.drain(quiet=0.3))
    await asyncio.sleep(0.1)  # a sleep, not a wait: the drain must not end within this time
    assert not draining.done()  # idle from the start, but not quiet for long enough yet
    late = TokenBatch(generation_id="g2", offset=0, token_ids=[], open=ParseSpec(request_id="r2"), gateway="gw")
    await sessions.on_tokens(TokenFrame(batches=[late]))
    await asyncio.sleep(0.4)  # longer than the quiet period: the open generation alone holds the drain
    assert not draining.done()  # quiet long since, but the late generation is still open
    done = TokenBatch(generation_id="g2", offset=0, done=True, finish_reason="stop")
    await sessions.on_tokens(TokenFrame(batches=[done]))
    await asyncio.wait_for(draining, 2)
    assert [subject for subject, _ in bus.sent] == ["t.events.gw"]  # its end went out first


async def test_draining_an_idle_worker_takes_the_quiet_period() -> None:
    sessions = Sessions(cast(Bus, NoBus()), "w1")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(sessions.drain(quiet=0.2), 2)
    assert loop.time() - started >= 0.19


async def test_draining_does_not_wait_for_quiet_when_no_gateway_is_left() -> None:
    sessions = Sessions(cast(Bus, NoBus()), "w1")
    await asyncio.wait_for(sessions.drain(quiet=30.0, senders=lambda: False), 1)
