"""The dispatcher service over real NATS, when engines fail: an engine that is down, a worker
that went away after its health check, HTTP errors, errors mid-stream, output and context
limits; and the heartbeat that reports the engines' health."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from contracts.errors import ErrorCode
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.bus import generate_request
from tests.dispatcher.stack import ENC, check_stream, dispatcher, ids, new_id
from tests.simengine.prompts import user_prompt


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


@pytest.fixture
def dead_url() -> Iterator[str]:
    """An address that refuses connections: bound (so no one else takes it), not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_engine_down_is_engine_unavailable_quickly(nats_url: str, namespace: str, dead_url: str) -> None:
    g = new_id("down")
    async with dispatcher(nats_url, namespace, [f"vllm={dead_url}"]) as d:
        t0 = time.monotonic()
        await d.send(generate_request(g, user_prompt("hi")))
        failed = await d.failed(g)
        elapsed = time.monotonic() - t0
        assert not await d.tokens.quiet(0.2)  # the parser never hears of it
    assert failed.error.code == ErrorCode.ENGINE_UNAVAILABLE, failed.error
    assert "unreachable" in failed.error.message
    assert elapsed < 2, elapsed


async def test_next_healthy_worker_is_tried(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """A worker that passed its health check and then went away: the request moves on to the
    next worker, and the one that failed is reported down (by that request: the next health
    poll is a minute away)."""
    doomed_cm = serving(SimSettings(protocol="both"))
    doomed = await doomed_cm.__aenter__()
    gone = False
    try:
        async with dispatcher(
            nats_url,
            namespace,
            [f"vllm={doomed.url}", f"sim={sim.url}"],
            health_interval_s=60,
            # round robin offers one of two requests to the dead worker first (cache-aware
            # routing would keep the later ones on the engine that holds their prompt)
            routing="round_robin",
        ) as d:
            assert (await d.beat()).detail.startswith("2/2")
            await doomed_cm.__aexit__(None, None, None)
            gone = True
            for i in range(2):
                g = new_id(f"retry-{i}")
                await d.send(generate_request(g, user_prompt("hi")))
                assert (await d.accepted(g)).worker == sim.url
                assert (await d.stream(g))[-1].finish_reason == "stop"
            async with asyncio.timeout(10):  # well before the next health poll
                beat = await d.beat()
                while beat.detail.startswith("2/2"):
                    beat = await d.beat()
            assert beat.ready and beat.detail.startswith("1/2") and doomed.url in beat.detail
    finally:
        if not gone:
            await doomed_cm.__aexit__(None, None, None)


async def test_engine_http_errors(nats_url: str, namespace: str, sim: RunningSim) -> None:
    async with dispatcher(nats_url, namespace, [f"sglang={sim.url}"]) as d:
        e503, e400 = new_id("e503"), new_id("e400")
        await d.send(generate_request(e503, user_prompt("x [[sim:status=503]]")))
        assert (await d.failed(e503)).error.code == ErrorCode.ENGINE_ERROR
        await d.send(generate_request(e400, user_prompt("x [[sim:status=400]]")))
        assert (await d.failed(e400)).error.code == ErrorCode.INVALID_REQUEST
        assert not d.tokens.of[e503] and not d.tokens.of[e400]


async def test_mid_stream_error_ends_with_an_error_batch(nats_url: str, namespace: str, sim: RunningSim) -> None:
    g = new_id("mid")
    async with dispatcher(nats_url, namespace, [f"vllm={sim.url}"]) as d:
        await d.send(generate_request(g, user_prompt("x [[sim:error_after=6]]")))
        await d.accepted(g)
        batches = await d.stream(g)
    check_stream(batches, g)
    last = batches[-1]
    assert last.finish_reason == "error" and last.error is not None
    assert last.error.code == ErrorCode.ENGINE_ERROR
    assert len(ids(batches)) == 6


async def test_max_tokens_and_context_length(nats_url: str, namespace: str, sim: RunningSim) -> None:
    prompt = user_prompt("a story")
    g, ctx = new_id("len"), new_id("ctx")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        await d.send(generate_request(g, prompt, max_tokens=5))
        batches = await d.stream(g)
        await d.send(generate_request(ctx, user_prompt("hi"), max_tokens=10**6))
        failed = await d.failed(ctx)
    check_stream(batches, g)
    assert ids(batches) == plan(prompt, ENC).output_ids[:5]
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id, last.error) == ("length", None, None)
    assert last.usage is not None and last.usage.completion_tokens == 5
    assert failed.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED


async def test_heartbeat_follows_the_engines(nats_url: str, namespace: str, sim: RunningSim, dead_url: str) -> None:
    """The first beat already reflects the engines' health (the first poll came first)."""
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        beat = await d.beat()
    assert (beat.service, beat.ready, beat.draining, beat.stopping) == ("dispatcher", True, False, False)
    assert beat.detail.startswith("1/1")
    async with dispatcher(nats_url, f"{namespace}x", [f"vllm={dead_url}"]) as d:
        beat = await d.beat()
    assert not beat.ready
    assert beat.detail.startswith("0/1") and dead_url in beat.detail
