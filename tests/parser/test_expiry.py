"""A parser worker drops the sessions whose tokens stopped coming (their dispatcher and gateway
are gone), and says when it holds none (draining waits for that)."""

from __future__ import annotations

import asyncio
from typing import cast

from contracts.messages.generate import ParseSpec, TokenBatch, TokenFrame
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
    await asyncio.sleep(0.05)
    assert sessions.expire(0.01) == 1
    assert len(sessions) == 0 and sessions.idle.is_set()
    # tokens for the expired generation are dropped, not a new session
    await sessions.on_tokens(TokenFrame(batches=[TokenBatch(generation_id="g1", offset=0, token_ids=[1, 2])]))
    assert len(sessions) == 0
