"""The dispatcher service over real NATS, in front of the stand-in engine (in this process)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from pydantic import TypeAdapter

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel, Ping, Pong
from contracts.messages.generate import (
    GenerateAccepted,
    GenerateReply,
    GenerateRequest,
    SamplingParams,
    TokenBatch,
)
from contracts.subjects import REQUEST_ID_HEADER, Subjects
from services.common import bus
from services.common.harmony import CALL, RETURN, harmony_encoding
from services.dispatcher.app import run
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.simengine.prompts import WEATHER, user_prompt

ENC = harmony_encoding()
REPLY: TypeAdapter[GenerateAccepted] = TypeAdapter(GenerateReply)  # type: ignore[arg-type]
SLOW = "keep going [[sim:tokens=5000]] [[sim:delay_ms=5]]"


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running:
        yield running


@pytest.fixture(scope="module")
async def sim_incremental() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="sglang", sglang_incremental=True, tokens_per_chunk=4)) as running:
        yield running


@pytest.fixture
def dead_url() -> Iterator[str]:
    """An address that refuses connections: bound (so no one else takes it), not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class Bus:
    nc: NatsClient
    subjects: Subjects
    settings: Settings

    async def generate(self, req: GenerateRequest, timeout: float = 10) -> GenerateAccepted:
        return await bus.request(self.nc, self.subjects.generate, req, REPLY,
                                 request_id=req.request_id, timeout=timeout, service="dispatcher")

    async def ping(self) -> Pong:
        return await bus.request(self.nc, self.subjects.health("dispatcher"), Ping(),
                                 TypeAdapter(Pong), request_id="ping", timeout=5, service="dispatcher")


@contextlib.asynccontextmanager
async def dispatcher(nats_url: str, namespace: str, engines: list[str], **kw: object) -> AsyncIterator[Bus]:
    settings = Settings(nats_url=nats_url, namespace=namespace, engines=engines, **kw)  # type: ignore[arg-type]
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(settings, stop, ready=ready))
    nc = await nats.connect(nats_url)
    try:
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait((waiter, task), timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            await task  # raises what failed
        assert ready.is_set(), "the dispatcher did not start"
        yield Bus(nc, settings.subjects, settings)
    finally:
        await nc.close()
        stop.set()
        await asyncio.wait_for(task, 10)


class Tokens:
    """A token subject and the batches arriving on it."""

    def __init__(self, nc: NatsClient, subject: str) -> None:
        self.nc, self.subject = nc, subject
        self.queue: asyncio.Queue[tuple[TokenBatch, str | None]] = asyncio.Queue()

    async def __aenter__(self) -> Tokens:
        async def on(msg: Msg) -> None:
            self.queue.put_nowait((TokenBatch.model_validate_json(msg.data),
                                   (msg.headers or {}).get(REQUEST_ID_HEADER)))

        self.sub = await self.nc.subscribe(self.subject, cb=on)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sub.unsubscribe()

    async def next(self, timeout: float = 5) -> TokenBatch:
        batch, header = await asyncio.wait_for(self.queue.get(), timeout)
        assert header == batch.request_id
        return batch

    async def until_done(self, timeout: float = 10, first_seq: int = 0) -> list[TokenBatch]:
        out: list[TokenBatch] = []
        async with asyncio.timeout(timeout):
            while not out or not out[-1].done:
                out.append(await self.next(timeout))
        assert [b.seq for b in out] == list(range(first_seq, first_seq + len(out)))
        return out


def gen_request(bus_: Bus, prompt: list[int], rid: str, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, model="openai/gpt-oss-20b", prompt_token_ids=prompt,
        stop_token_ids=[RETURN, CALL], token_subject=bus_.subjects.parser_tokens("test"),
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", ["sim", "vllm", "sglang", "sglang-incremental"])
async def test_generate_streams_token_batches(
    nats_url: str, namespace: str, sim: RunningSim, sim_incremental: RunningSim, kind: str
) -> None:
    engine = f"sglang={sim_incremental.url}" if kind == "sglang-incremental" else f"{kind}={sim.url}"
    async with dispatcher(nats_url, namespace, [engine]) as b:
        prompt = user_prompt("Weather in Oslo please", [WEATHER])
        req = gen_request(b, prompt, f"g-{kind}")
        async with Tokens(b.nc, req.token_subject) as tokens:
            accepted = await b.generate(req)
            assert accepted.engine == kind.split("-")[0] and accepted.worker.startswith("http://")
            batches = await tokens.until_done()
    expected = plan(prompt, ENC).output_ids
    assert [t for x in batches for t in x.token_ids] == expected
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id, last.error) == ("stop", CALL, None)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), len(expected))
    if kind == "sglang-incremental":
        assert all(len(x.token_ids) <= 4 for x in batches)  # as the engine chunked it


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_cancel_aborts_the_engine_request(
    nats_url: str, namespace: str, sim: RunningSim, kind: str
) -> None:
    async with dispatcher(nats_url, namespace, [f"{kind}={sim.url}"]) as b:
        req = gen_request(b, user_prompt(SLOW), f"cancel-{kind}-{namespace}")
        async with Tokens(b.nc, req.token_subject) as tokens:
            await b.generate(req)
            first = await tokens.next()
            assert not first.done
            await b.nc.publish(b.subjects.cancel, bus.dump(Cancel(request_id=req.request_id)))
            record = await sim.recorder.wait_aborted(req.request_id, timeout=5)
            rest = await tokens.until_done(first_seq=1)
    assert record.aborted and not record.finished
    if kind == "sglang":
        assert record.abort_requested  # POST /abort_request, not only a closed connection
    assert rest[-1].done and rest[-1].finish_reason == "abort" and rest[-1].error is None


async def test_engine_down_is_engine_unavailable_quickly(
    nats_url: str, namespace: str, dead_url: str
) -> None:
    async with dispatcher(nats_url, namespace, [f"vllm={dead_url}"]) as b:
        t0 = time.monotonic()
        with pytest.raises(bus.BusFailure) as failure:
            await b.generate(gen_request(b, user_prompt("hi"), "down"))
        elapsed = time.monotonic() - t0
        assert failure.value.error.code == ErrorCode.ENGINE_UNAVAILABLE, failure.value.error
        assert "unreachable" in failure.value.error.message
        assert elapsed < 2, elapsed


async def test_next_healthy_worker_is_tried(
    nats_url: str, namespace: str, sim: RunningSim, dead_url: str
) -> None:
    async with dispatcher(nats_url, namespace, [f"vllm={dead_url}", f"sim={sim.url}"],
                          health_interval_s=60) as b:
        for i in range(3):  # round robin starts on the dead worker at least once
            req = gen_request(b, user_prompt("hi"), f"retry-{i}-{namespace}")
            async with Tokens(b.nc, req.token_subject) as tokens:
                accepted = await b.generate(req)
                assert accepted.worker == sim.url
                assert (await tokens.until_done())[-1].finish_reason == "stop"


async def test_engine_5xx_is_engine_error(nats_url: str, namespace: str, sim: RunningSim) -> None:
    async with dispatcher(nats_url, namespace, [f"sglang={sim.url}"]) as b:
        with pytest.raises(bus.BusFailure) as failure:
            await b.generate(gen_request(b, user_prompt("x [[sim:status=503]]"), "e503"))
        assert failure.value.error.code == ErrorCode.ENGINE_ERROR
        with pytest.raises(bus.BusFailure) as failure:
            await b.generate(gen_request(b, user_prompt("x [[sim:status=400]]"), "e400"))
        assert failure.value.error.code == ErrorCode.INVALID_REQUEST


async def test_mid_stream_error_ends_with_an_error_batch(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    async with dispatcher(nats_url, namespace, [f"vllm={sim.url}"]) as b:
        req = gen_request(b, user_prompt("x [[sim:error_after=6]]"), f"mid-{namespace}")
        async with Tokens(b.nc, req.token_subject) as tokens:
            await b.generate(req)
            batches = await tokens.until_done()
    last = batches[-1]
    assert last.finish_reason == "error" and last.error is not None
    assert last.error.code == ErrorCode.ENGINE_ERROR
    assert sum(len(x.token_ids) for x in batches) == 6


async def test_max_tokens_and_context_length(nats_url: str, namespace: str, sim: RunningSim) -> None:
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as b:
        req = gen_request(b, user_prompt("a story"), f"len-{namespace}", max_tokens=5)
        async with Tokens(b.nc, req.token_subject) as tokens:
            await b.generate(req)
            batches = await tokens.until_done()
        assert batches[-1].finish_reason == "length" and batches[-1].usage.completion_tokens == 5
        with pytest.raises(bus.BusFailure) as failure:
            await b.generate(gen_request(b, user_prompt("hi"), "ctx", max_tokens=10**6))
        assert failure.value.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED


async def test_health_follows_the_engines(
    nats_url: str, namespace: str, sim: RunningSim, dead_url: str
) -> None:
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as b:
        pong = await b.ping()
        assert pong.ready and "1/1" in pong.detail
    async with dispatcher(nats_url, f"{namespace}x", [f"vllm={dead_url}"]) as b:
        deadline = time.monotonic() + 5
        pong = await b.ping()
        while pong.ready:  # until the first poll (run at start) has been answered
            assert time.monotonic() < deadline
            pong = await b.ping()
        assert "0/1" in pong.detail and dead_url in pong.detail


async def test_stop_ends_open_streams_with_a_final_batch(
    nats_url: str, namespace: str, sim: RunningSim
) -> None:
    listener = await nats.connect(nats_url)  # outlives the dispatcher
    try:
        req = None
        async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as b:
            req = gen_request(b, user_prompt(SLOW), f"stop-{namespace}")
            tokens = await Tokens(listener, req.token_subject).__aenter__()
            await b.generate(req)
            await tokens.next()
        rest = await tokens.until_done(first_seq=1)
        assert rest[-1].error is not None and rest[-1].error.code == ErrorCode.SERVICE_UNAVAILABLE
        assert rest[-1].finish_reason == "error"
        await sim.recorder.wait_aborted(req.request_id, timeout=5)
    finally:
        await listener.close()


async def test_many_concurrent_requests(nats_url: str, namespace: str, sim: RunningSim) -> None:
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as b:
        prompt = user_prompt("bench [[sim:tokens=200]]")
        expected = plan(prompt, ENC).output_ids
        subject = b.subjects.parser_tokens("many")
        streams: dict[str, list[TokenBatch]] = {}
        done = asyncio.Event()

        async def on(msg: Msg) -> None:
            batch = TokenBatch.model_validate_json(msg.data)
            streams.setdefault(batch.request_id, []).append(batch)
            if sum(1 for s in streams.values() if s[-1].done) == 64:
                done.set()

        sub = await b.nc.subscribe(subject, cb=on)
        await b.nc.flush()
        reqs = [gen_request(b, prompt, f"m{i}-{namespace}").model_copy(update={"token_subject": subject})
                for i in range(64)]
        await asyncio.gather(*(b.generate(r) for r in reqs))
        await asyncio.wait_for(done.wait(), 20)
        await sub.unsubscribe()
    for r in reqs:
        got = streams[r.request_id]
        assert [x.seq for x in got] == list(range(len(got)))
        assert [t for x in got for t in x.token_ids] == expected


async def test_cancel_races_without_a_bus(sim: RunningSim) -> None:
    """A cancel heard before the generate request refuses it; a cancel right after the accept,
    before the stream task first runs, still aborts the engine and ends with "abort"."""
    batches: list[TokenBatch] = []
    ended = asyncio.Event()

    async def publish(subject: str, data: bytes, headers: dict[str, str]) -> None:
        batches.append(TokenBatch.model_validate_json(data))
        if batches[-1].done:
            ended.set()

    settings = Settings(engines=[f"sim={sim.url}"])
    async with Dispatcher(settings) as d:
        d.bind(publish)
        subjects = Subjects("unit")
        fake = Bus(None, subjects, settings)  # type: ignore[arg-type]
        assert d.cancel("early") is False
        refused = await d.generate(gen_request(fake, user_prompt("hi"), "early"))
        assert isinstance(refused, BusError) and refused.code == ErrorCode.CANCELLED
        accepted = await d.generate(gen_request(fake, user_prompt(SLOW), "quick-cancel"))
        assert isinstance(accepted, GenerateAccepted)
        assert d.cancel("quick-cancel") is True
        await asyncio.wait_for(ended.wait(), 5)
        await sim.recorder.wait_aborted("quick-cancel", timeout=5)
    assert [b.finish_reason for b in batches] == ["abort"]


async def test_unreadable_requests_get_an_error_reply(nats_url: str, namespace: str, sim: RunningSim) -> None:
    async with dispatcher(nats_url, namespace, [f"sim={sim.url}"]) as b:
        for payload, param in ((b"garbage", None), (b'{"kind": "generate"}', "request_id")):
            reply = await b.nc.request(b.subjects.generate, payload, timeout=5)
            error = TypeAdapter(BusError).validate_json(reply.data)
            assert error.code == ErrorCode.INVALID_REQUEST and error.param == param
        await b.nc.publish(b.subjects.cancel, b"garbage")  # ignored, the service goes on
        assert (await b.ping()).ready
