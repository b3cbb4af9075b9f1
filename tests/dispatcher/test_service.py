"""The dispatcher service over real NATS, in front of the simulated engine (in this process).

The test plays the encoder (``GenerateRequest`` on the generate subject), the owning gateway
(``EventFrame``s on its events subject, heartbeats) and the parser worker (``TokenFrame``s on
its tokens subject)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from contracts.errors import ErrorCode
from contracts.messages.control import Cancel, Heartbeat
from contracts.messages.generate import (
    EventFrame,
    GatewayEvent,
    GenerateRequest,
    GenerationAccepted,
    GenerationFailed,
    ParseSpec,
    TokenBatch,
    TokenFrame,
)
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.harmony import CALL, harmony_encoding
from services.dispatcher.app import run
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.bus import ByGeneration, Tap, adapter, client, generate_request, running
from tests.simengine.prompts import WEATHER, user_prompt

ENC = harmony_encoding()
SLOW = "keep going [[sim:tokens=5000]] [[sim:delay_ms=5]]"  # 25 s unless ended early
TOOL_PROMPT = user_prompt("Weather in Oslo please", [WEATHER])  # the script calls get_weather


def new_id(name: str) -> str:
    """Generation ids are engine request ids: unique, since the simulators outlive a test."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


@pytest.fixture(scope="module")
async def sim_incremental() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="sglang", sglang_incremental=True, tokens_per_chunk=4)) as running_sim:
        yield running_sim


@pytest.fixture(scope="module")
async def sim_prefill() -> AsyncIterator[RunningSim]:
    """First tokens 100 ms after the engine answered: the opening batch goes out alone."""
    async with serving(SimSettings(protocol="both", prefill_delay_ms=100)) as running_sim:
        yield running_sim


@pytest.fixture
def dead_url() -> Iterator[str]:
    """An address that refuses connections: bound (so no one else takes it), not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class Stack:
    """A running dispatcher, and the test in the roles around it: the encoder sending
    requests, gateway g1 reading its events, parser p1 reading its tokens."""

    bus: Bus  # the test's own connection
    settings: Settings
    stop: asyncio.Event  # set: the dispatcher drains and stops
    tokens: ByGeneration[TokenBatch]  # parser p1
    events: ByGeneration[GatewayEvent]  # gateway g1
    beats: Tap[Heartbeat]  # the dispatcher's heartbeats

    async def send(self, req: GenerateRequest | bytes) -> None:
        await self.bus.publish(self.bus.subjects.generate, req)

    async def cancel(self, generation_id: str) -> None:
        await self.bus.publish(self.bus.subjects.cancel, Cancel(generation_id=generation_id))

    async def gateway_beat(self, instance: str, interval_s: float, *, stopping: bool = False) -> None:
        await self.bus.publish(self.bus.subjects.heartbeat("gateway"), Heartbeat(
            service="gateway", instance=instance, interval_s=interval_s, stopping=stopping))

    async def accepted(self, generation_id: str, timeout: float = 5) -> GenerationAccepted:
        event = await self.events.next(generation_id, timeout)
        assert isinstance(event, GenerationAccepted), event
        return event

    async def failed(self, generation_id: str, timeout: float = 5) -> GenerationFailed:
        event = await self.events.next(generation_id, timeout)
        assert isinstance(event, GenerationFailed), event
        assert event.stage == "dispatcher"
        return event

    async def stream(self, generation_id: str, timeout: float = 10) -> list[TokenBatch]:
        """The generation's batches (those not read yet) up to the done one."""
        out: list[TokenBatch] = []
        async with asyncio.timeout(timeout):
            while not out or not out[-1].done:
                out.append(await self.tokens.next(generation_id, timeout))
        return out

    async def beat(self, timeout: float = 5) -> Heartbeat:
        """The dispatcher's next heartbeat."""
        while True:
            beat = await self.beats.next(timeout)
            if beat.instance == self.settings.instance_id:
                return beat


@contextlib.asynccontextmanager
async def dispatcher(nats_url: str, namespace: str, engines: list[str], **kw: Any) -> AsyncIterator[Stack]:
    """The dispatcher's subjects are tapped before it starts; the taps outlive it."""
    settings = Settings(nats_url=nats_url, namespace=namespace, engines=engines, **kw)
    subjects = settings.subjects
    async with client(nats_url, namespace) as c, \
            Tap(c.nc, subjects.parser_tokens("p1"), adapter(TokenFrame)) as tokens, \
            Tap(c.nc, subjects.gateway_events("g1"), adapter(EventFrame)) as events, \
            Tap(c.nc, subjects.heartbeat("dispatcher"), adapter(Heartbeat)) as beats, \
            running(run, settings) as stop:
        yield Stack(c, settings, stop, ByGeneration(tokens, lambda f: f.batches),
                    ByGeneration(events, lambda f: f.events), beats)


def ids(batches: list[TokenBatch]) -> list[int]:
    return [t for b in batches for t in b.token_ids]


def check_stream(batches: list[TokenBatch], generation_id: str) -> None:
    """One whole stream: opened once by the first batch, offsets that follow each other,
    done only at the end."""
    first = batches[0]
    assert first.open == ParseSpec(request_id=generation_id) and first.gateway == "g1"
    assert first.offset == 0
    assert all(b.open is None for b in batches[1:])
    offset = 0
    for b in batches:
        assert b.offset == offset, [(x.offset, len(x.token_ids)) for x in batches]
        offset += len(b.token_ids)
    assert [b.done for b in batches] == [False] * (len(batches) - 1) + [True]


# the stream --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sim", "vllm", "sglang", "sglang-incremental"])
async def test_generate_streams_token_batches(
    nats_url: str, namespace: str, sim: RunningSim, sim_incremental: RunningSim, kind: str
) -> None:
    engine = sim_incremental if kind == "sglang-incremental" else sim
    expected = plan(TOOL_PROMPT, ENC).output_ids
    g = new_id(kind)
    async with dispatcher(nats_url, namespace, [f"{kind.split('-')[0]}={engine.url}"]) as d:
        await d.send(generate_request(g, TOOL_PROMPT))
        accepted = await d.accepted(g)
        batches = await d.stream(g)
    assert accepted.dispatcher == d.settings.instance_id
    assert (accepted.worker, accepted.engine) == (engine.url, kind.split("-")[0])
    assert accepted.prompt_tokens == len(TOOL_PROMPT)
    check_stream(batches, g)
    assert ids(batches) == expected and expected[-1] == CALL
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id, last.error) == ("stop", CALL, None)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(TOOL_PROMPT), len(expected))
    if kind == "sglang-incremental":  # deltas of 4 tokens, as the engine sent them
        assert all(len(b.token_ids) % 4 == 0 for b in batches[:-1])


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_resume_continues_an_interrupted_output(
    nats_url: str, namespace: str, sim_prefill: RunningSim, kind: str
) -> None:
    """The tokens an earlier attempt produced open the stream; the engine is given them after
    the prompt, continues from there, and usage counts the whole output."""
    expected = plan(TOOL_PROMPT, ENC).output_ids
    k = 5
    assert len(expected) > k + 3
    g, short = new_id("resume"), new_id("resume-short")
    async with dispatcher(nats_url, namespace, [f"{kind}={sim_prefill.url}"]) as d:
        await d.send(generate_request(g, TOOL_PROMPT, resume_tokens=expected[:k]))
        assert (await d.accepted(g)).prompt_tokens == len(TOOL_PROMPT)
        batches = await d.stream(g)
        record = await sim_prefill.recorder.wait_for(g)
        # the output budget counts the resumed tokens
        await d.send(generate_request(short, TOOL_PROMPT, resume_tokens=expected[:k], max_tokens=k + 3))
        clipped = await d.stream(short)
    assert record.prompt_token_ids == [*TOOL_PROMPT, *expected[:k]]
    check_stream(batches, g)
    assert (batches[0].offset, batches[0].token_ids) == (0, expected[:k])
    assert batches[1].offset == k
    assert ids(batches[1:]) == expected[k:]
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id, last.error) == ("stop", CALL, None)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(TOOL_PROMPT), len(expected))
    check_stream(clipped, short)
    assert ids(clipped) == expected[: k + 3] and clipped[-1].finish_reason == "length"
    assert clipped[-1].usage is not None
    assert (clipped[-1].usage.prompt_tokens, clipped[-1].usage.completion_tokens) == (len(TOOL_PROMPT), k + 3)


# ending a generation early -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_cancel_aborts_the_engine_request(
    nats_url: str, namespace: str, sim: RunningSim, kind: str
) -> None:
    g = new_id(f"cancel-{kind}")
    async with dispatcher(nats_url, namespace, [f"{kind}={sim.url}"]) as d:
        await d.send(generate_request(g, user_prompt(SLOW)))
        await d.accepted(g)
        first = await d.tokens.next(g)
        assert first.open is not None and not first.done
        await d.cancel(g)
        record = await sim.recorder.wait_aborted(g, timeout=5)
        rest = await d.stream(g)
    assert record.aborted and not record.finished
    if kind == "sglang":
        assert record.abort_requested  # POST /abort_request, not only a closed connection
    check_stream([first, *rest], g)
    last = rest[-1]
    assert (last.finish_reason, last.error) == ("abort", None)
    assert last.usage is not None and last.usage.completion_tokens == len(ids([first, *rest]))


async def test_given_up_requests_are_never_started(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    """A cancel heard before the request, or a deadline already past: dropped, the engine
    never sees it, nobody hears of it."""
    early, late, fine = new_id("early"), new_id("late"), new_id("fine")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        await d.cancel(early)
        await d.send(generate_request(early, user_prompt("hi")))
        await d.send(generate_request(late, user_prompt("hi"), deadline_in=-1))
        await d.send(generate_request(fine, user_prompt("hi")))
        await d.accepted(fine)
        assert (await d.stream(fine))[-1].finish_reason == "stop"
    assert sim.recorder.get(early) is None and sim.recorder.get(late) is None
    assert set(d.events.of) == {fine} and set(d.tokens.of) == {fine}


class FakeBus:
    """What ``Dispatcher.bind`` needs of a bus: subjects, and a publish that records."""

    def __init__(self, namespace: str) -> None:
        self.subjects = Subjects(namespace)
        self.sent: list[tuple[str, Any]] = []

    async def publish(self, subject: str, msg: Any, headers: dict[str, str] | None = None) -> None:
        self.sent.append((subject, msg))


async def test_cancel_before_the_stream_task_runs(sim: RunningSim) -> None:
    """A cancel handled right after the request, before its task first ran: the engine never
    sees it, nothing is sent, and the dispatcher does not keep it (load, drain)."""
    g = new_id("quick")
    fake = FakeBus("unit")
    async with Dispatcher(Settings(engines=[f"sim={sim.url}"])) as d:
        d.bind(fake)  # type: ignore[arg-type]
        await d.on_generate(generate_request(g, user_prompt(SLOW)))
        assert d.load == 1
        await d.on_cancel(Cancel(generation_id=g))
        await asyncio.wait_for(d.drain(), 2)
        assert d.load == 0 and not d.active
    assert fake.sent == [] and sim.recorder.get(g) is None


async def test_gateway_death_aborts_its_generations(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    """g1 says it stops (its last beat): its generations are aborted in the engine at once and
    ended for the parser; g2's goes on."""
    a, b = new_id("of-g1"), new_id("of-g2")
    # only the "stopping" beat can end g1 within this test: a missed beat takes 10 s
    async with dispatcher(nats_url, namespace, [f"vllm={sim.url}"], dead_after_s=10) as d:
        await d.gateway_beat("g1", 10)
        await d.gateway_beat("g2", 10)
        for g, gateway in ((a, "g1"), (b, "g2")):
            await d.send(generate_request(g, user_prompt(SLOW), gateway=gateway))
            assert (await d.tokens.next(g)).open is not None
        await d.gateway_beat("g1", 0.25, stopping=True)
        assert (await sim.recorder.wait_aborted(a, timeout=3)).aborted
        ended = await d.stream(a)
        assert (ended[-1].finish_reason, ended[-1].error) == ("abort", None)
        await still_streaming(d, sim, b)


async def test_silent_gateway_is_counted_dead(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """A gateway whose heartbeats stop: counted dead after gateway_dead_after_s, its generations
    aborted; another gateway's go on."""
    b, c = new_id("of-g2"), new_id("of-g3")
    async with dispatcher(nats_url, namespace, [f"vllm={sim.url}"], gateway_dead_after_s=0.5) as d:
        await d.gateway_beat("g2", 10)  # alive for 30 s
        for g, gateway in ((b, "g2"), (c, "g3")):
            await d.send(generate_request(g, user_prompt(SLOW), gateway=gateway))
            assert (await d.tokens.next(g)).open is not None
        await d.gateway_beat("g3", 0.1)  # and never again: dead after 0.5 s
        assert (await sim.recorder.wait_aborted(c, timeout=5)).aborted
        ended = await d.stream(c)
        assert (ended[-1].finish_reason, ended[-1].error) == ("abort", None)
        await still_streaming(d, sim, b)


async def still_streaming(d: Stack, sim: RunningSim, generation_id: str) -> None:
    """The generation streams on after what was read so far (then it is cancelled)."""
    d.tokens.unread(generation_id)
    more = await d.tokens.next(generation_id)  # sent after every frame read so far
    assert not more.done
    record = sim.recorder.get(generation_id)
    assert record is not None and not record.aborted
    await d.cancel(generation_id)
    assert (await d.stream(generation_id))[-1].finish_reason == "abort"


# engine failures ----------------------------------------------------------------------------
async def test_engine_down_is_engine_unavailable_quickly(
    nats_url: str, namespace: str, dead_url: str
) -> None:
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
    next worker, and the one that failed is reported down."""
    doomed_cm = serving(SimSettings(protocol="both"))
    doomed = await doomed_cm.__aenter__()
    gone = False
    try:
        async with dispatcher(nats_url, namespace, [f"vllm={doomed.url}", f"sim={sim.url}"],
                              health_interval_s=60) as d:
            assert (await d.beat()).detail.startswith("2/2")
            await doomed_cm.__aexit__(None, None, None)
            gone = True
            for i in range(3):  # round robin: the first one is offered to the dead worker first
                g = new_id(f"retry-{i}")
                await d.send(generate_request(g, user_prompt("hi")))
                assert (await d.accepted(g)).worker == sim.url
                assert (await d.stream(g))[-1].finish_reason == "stop"
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


async def test_mid_stream_error_ends_with_an_error_batch(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
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


# the service --------------------------------------------------------------------------------
async def test_heartbeat_follows_the_engines(
    nats_url: str, namespace: str, sim: RunningSim, dead_url: str
) -> None:
    """The first beat already reflects the engines' health (the first poll came first)."""
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        beat = await d.beat()
    assert (beat.service, beat.ready, beat.draining, beat.stopping) == ("dispatcher", True, False, False)
    assert beat.detail.startswith("1/1")
    async with dispatcher(nats_url, f"{namespace}x", [f"vllm={dead_url}"]) as d:
        beat = await d.beat()
    assert not beat.ready
    assert beat.detail.startswith("0/1") and dead_url in beat.detail


async def test_stop_ends_streams_in_hand_as_retryable(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    """Draining waits for streams in hand up to drain_timeout_s; what is left then ends with
    a retryable error (the gateway continues it elsewhere) and is aborted in the engine."""
    g = new_id("stop")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"], drain_timeout_s=0.3) as d:
        await d.send(generate_request(g, user_prompt(SLOW)))
        first = await d.tokens.next(g)
        t0 = time.monotonic()
        d.stop.set()
        rest = await d.stream(g)
        waited = time.monotonic() - t0
        await sim.recorder.wait_aborted(g, timeout=5)
    check_stream([first, *rest], g)
    last = rest[-1]
    assert last.finish_reason == "error" and last.error is not None
    assert last.error.code == ErrorCode.SERVICE_UNAVAILABLE and last.error.retryable
    assert waited >= 0.3, waited


async def test_stop_waits_for_streams_in_hand(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """With time enough, draining lets the stream finish normally; peers are told the
    dispatcher drains, then that it stopped."""
    prompt = user_prompt("short [[sim:tokens=100]] [[sim:delay_ms=10]]")  # about 1 s
    g = new_id("drain")
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"], drain_timeout_s=20) as d:
        await d.send(generate_request(g, prompt))
        first = await d.tokens.next(g)
        d.stop.set()
        beat = await d.beat()
        while not beat.draining:
            beat = await d.beat()
        assert beat.load == 1  # the stream was in hand when the dispatcher began to drain
        rest = await d.stream(g)
        while not beat.stopping:
            beat = await d.beat()
    batches = [first, *rest]
    check_stream(batches, g)
    assert ids(batches) == plan(prompt, ENC).output_ids
    assert (batches[-1].finish_reason, batches[-1].error) == ("stop", None)


async def test_many_concurrent_requests(nats_url: str, namespace: str, sim: RunningSim) -> None:
    """Every stream complete and in order; while the dispatcher is busy, one frame carries
    the batches of several generations."""
    prompt = user_prompt("bench [[sim:tokens=200]]")
    expected = plan(prompt, ENC).output_ids
    gens = [new_id(f"m{i}") for i in range(100)]
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        for g in gens:
            await d.send(generate_request(g, prompt))
        async with asyncio.timeout(60):
            streams = {g: await d.stream(g, timeout=60) for g in gens}
            accepted = [await d.accepted(g) for g in gens]
    assert all(a.worker == sim.url for a in accepted)
    for g, batches in streams.items():
        check_stream(batches, g)
        assert ids(batches) == expected
        assert batches[-1].finish_reason == "stop"
    assert d.tokens.frames < d.tokens.items, (d.tokens.frames, d.tokens.items)


async def test_garbage_on_the_bus_does_not_stop_the_service(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    """Unreadable or wrong-typed messages are dropped (nobody hears of them); the next
    request is served."""
    ok = new_id("ok")
    wrong_type = generate_request(new_id("bad"), user_prompt("hi")).model_dump(mode="json")
    wrong_type["prompt_token_ids"] = "not a list"
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as d:
        for payload in (b"garbage", b"[]", b'{"kind": "generate"}',
                        Cancel(generation_id=new_id("cancel")).model_dump_json().encode(),
                        TokenFrame(batches=[]).model_dump_json().encode()):
            await d.send(payload)
        await d.send(json.dumps(wrong_type).encode())
        await d.bus.publish(d.bus.subjects.cancel, b"garbage")
        await d.bus.publish(d.bus.subjects.heartbeat("gateway"), b"{}")
        await d.send(generate_request(ok, user_prompt("hi")))
        await d.accepted(ok)
        batches = await d.stream(ok)
    check_stream(batches, ok)
    assert batches[-1].finish_reason == "stop"
    assert set(d.events.of) == {ok} and set(d.tokens.of) == {ok}
