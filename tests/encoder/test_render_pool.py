"""The render pool (found by tests/e2e/test_hostile.py): a caller's mistake raised in a render
process comes back as that mistake, and a pool whose process died is replaced. A RenderError
could not be unpickled, which broke the pool: every large prompt after it was a 500."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import os
import pickle
from types import SimpleNamespace
from typing import Any, cast

import pytest

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import GenerateJob
from contracts.messages.items import MessageItem
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.wire import Wire
from services.encoder import app as encoder_app
from services.encoder import service
from services.encoder.render import EncodedPrompt, RenderError
from services.encoder.service import Encoder
from services.encoder.settings import Settings
from tests.bus import job

BIG = "x" * 1_200_000  # past the context (150,000 tokens), and rendered in the pool


def test_a_render_error_survives_pickling() -> None:
    error = BusError(code=ErrorCode.CONTEXT_LENGTH_EXCEEDED, message="too long", param="messages")
    again = pickle.loads(pickle.dumps(RenderError(error)))
    assert isinstance(again, RenderError) and again.error == error


_RENDER = service._render


def _die_on_request(req: EncodeRequest, today: dt.date, cutoff: str, limit: int, reserve: int) -> EncodedPrompt:
    """The pool's render function, except that a render process dies (out of memory, say)
    on a prompt that starts with "die" (a pool process forked later inherits this function)."""
    last = req.items[-1]
    if isinstance(last, MessageItem) and last.content.startswith("die"):
        os._exit(1)
    return _RENDER(req, today, cutoff, limit, reserve)


async def test_the_pool_reports_caller_mistakes_and_outlives_a_dead_process(monkeypatch: pytest.MonkeyPatch) -> None:
    unused = Bus(Wire(["nats://127.0.0.1:1"]), Subjects("unit"))  # never connected: these renders publish nothing
    encoder = Encoder(Settings(render_processes=1, inline_render_chars=1000), bus=unused)
    encoder.start_pool()

    async def render(j: GenerateJob) -> EncodedPrompt:
        return await encoder.render(j, encoder._pooled(j))

    try:
        for _ in range(2):  # the pool still serves after a caller's mistake
            with pytest.raises(RenderError) as refused:
                await render(job("g1", BIG))
            assert refused.value.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
        monkeypatch.setattr(service, "_render", _die_on_request)
        with pytest.raises(concurrent.futures.BrokenExecutor):
            await render(job("g2", "die" + BIG))
        prompt = await render(job("g3", "y " * 1000))  # a new pool
        assert len(prompt.token_ids) > 1000
    finally:
        encoder.close()


async def test_the_encoder_takes_jobs_once_its_render_processes_are_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render process loads the vocabulary when it starts (about a second); a long prompt
    taken before that waited for it, after the stack said it was ready (the fleet benchmark's
    first turns took 0.5 s more)."""
    warming: list[concurrent.futures.Future[None]] = []
    start_pool = Encoder.start_pool

    def starting(self: Encoder) -> None:
        start_pool(self)
        warming.extend(self._warming)

    taken: list[bool] = []

    async def wire(rt: object, encoder: Encoder) -> None:  # where the role starts taking jobs
        taken.append(bool(warming) and all(f.done() and f.exception() is None for f in warming))

    monkeypatch.setattr(Encoder, "start_pool", starting)
    monkeypatch.setattr(encoder_app, "wire", wire)
    rt = SimpleNamespace(bus=Bus(Wire(["nats://127.0.0.1:1"]), Subjects("unit")))
    async with encoder_app.role(cast(Any, rt), Settings(render_processes=1)):
        pass
    assert taken == [True]
