"""A busy dispatcher reads each engine stream at most once per window (past its first tokens),
so events the engine sent one at a time arrive many to a read and leave as one batch; an idle
one reads each event as it comes. Against a scripted local server, on asyncio and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from contracts.messages.generate import TokenBatch
from services.dispatcher.batches import URGENT_TOKENS, BatchWriter, relay
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.stream import open_stream
from services.dispatcher.service import Active, Dispatcher
from services.dispatcher.settings import Settings
from tests.dispatcher.test_http_relay import generate_request, vllm_event
from tests.dispatcher.tiny_server import SSE_HEAD, Tiny, chunk, client, on_uvloop, tiny

TOKENS = URGENT_TOKENS + 30
GAP_S = 0.004  # between the engine's events


async def one_event_at_a_time(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(SSE_HEAD)
    for i in range(TOKENS):
        writer.write(chunk(vllm_event([100 + i])))
        await writer.drain()
        await asyncio.sleep(GAP_S)  # pacing: the engine's events one at a time
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": %d}}\n\n' % (TOKENS + 1)
    writer.write(chunk(vllm_event([200002], "stop")) + chunk(usage) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def batches_read(window: Callable[[], float] | None) -> list[TokenBatch]:
    req = generate_request("r1")
    batches: list[TokenBatch] = []
    async with tiny(one_event_at_a_time) as server, client() as http:
        stream = await open_stream(http, server.url, make_adapter("vllm"), req, accept_timeout=5, read_timeout=5)
        try:
            await relay(stream, BatchWriter(lambda batch, urgent: batches.append(batch), req), window)
        finally:
            stream.close()
    return batches


def tokens(batches: list[TokenBatch]) -> list[int]:
    return [t for b in batches for t in b.token_ids]


async def paced_reads_take_many_events_at_a_time() -> None:
    unpaced = await batches_read(None)
    paced = await batches_read(lambda: 0.05)
    expected = [100 + i for i in range(TOKENS)] + [200002]
    assert tokens(unpaced) == tokens(paced) == expected  # nothing lost, nothing reordered
    # the first tokens are never held back: one batch per event, as they came
    assert [b.token_ids for b in paced[:URGENT_TOKENS]] == [[100 + i] for i in range(URGENT_TOKENS)]
    # the rest came over >= 120 ms: read at most every 50 ms, a handful of reads, not 30
    rest = len(paced) - URGENT_TOKENS
    assert rest <= 8, [b.token_ids for b in paced]
    assert len(unpaced) - URGENT_TOKENS > 2 * rest  # the control: unpaced, reads follow the events


@pytest.mark.parametrize("scenario", [paced_reads_take_many_events_at_a_time], ids=lambda f: f.__name__)
async def test_on_asyncio(scenario: Callable[[], Awaitable[None]]) -> None:
    await scenario()


@pytest.mark.parametrize("scenario", [paced_reads_take_many_events_at_a_time], ids=lambda f: f.__name__)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    on_uvloop(scenario)


def in_flight(n: int) -> dict[str, Active]:
    return {str(i): Active(generate_request(str(i))) for i in range(n)}


async def test_the_window_grows_with_the_generations_in_flight_up_to_the_maximum() -> None:
    dispatcher = Dispatcher(Settings(engines=[], coalesce_window_ms=1.0, coalesce_max_window_ms=20.0), engines=[])
    windows: list[float] = []
    for n in (0, 1, 4, 19, 20, 64):
        dispatcher.active = in_flight(n)
        windows.append(round(dispatcher.window() * 1000, 6))
    assert windows == [1.0, 1.0, 4.0, 19.0, 20.0, 20.0]
    fixed = Dispatcher(Settings(engines=[], coalesce_window_ms=2.0, coalesce_max_window_ms=0.0), engines=[])
    fixed.active = in_flight(64)
    assert fixed.window() == 0.002  # a maximum of 0 keeps the window as it is
