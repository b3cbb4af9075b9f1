"""The relay from an engine's HTTP stream to token batches, against a scripted local server:
one batch per read, usage awaited, and an engine that dies or stalls mid-stream ending the
stream with an error batch; each on the default event loop and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest

from contracts.errors import ErrorCode
from contracts.messages.generate import GenerateRequest, ParseSpec, Route, SamplingParams, TokenBatch
from services.dispatcher.batches import BatchWriter, relay
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.http import EngineHttp
from services.dispatcher.engines.stream import open_stream
from tests.dispatcher.tiny_server import SSE_HEAD, Tiny, chunk, client, on_uvloop, reset, tiny


def vllm_event(ids: list[int], finish: str | None = None) -> bytes:
    event = {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def generate_request(rid: str) -> GenerateRequest:
    return GenerateRequest(
        generation_id=rid,
        model="openai/gpt-oss-20b",
        prompt_token_ids=[1, 2, 3],
        stop_token_ids=[200002],
        parse=ParseSpec(request_id=rid),
        route=Route(gateway="g", parser="p"),
        deadline=2e9,
        sampling=SamplingParams(),
    )


async def relay_from(
    server: Tiny, http: EngineHttp, *, read_timeout: float = 5, on_batch: Callable[[TokenBatch], None] | None = None
) -> list[TokenBatch]:
    req = generate_request("r1")
    batches: list[TokenBatch] = []

    def put(batch: TokenBatch, urgent: bool) -> None:
        batches.append(batch)
        if on_batch is not None:
            on_batch(batch)

    stream = await open_stream(http, server.url, make_adapter("vllm"), req, accept_timeout=5, read_timeout=read_timeout)
    try:
        await relay(stream, BatchWriter(put, req))
    finally:
        stream.close()
    return batches


async def relay_engine_died() -> None:
    """The engine dies mid-stream: the tokens so far, then a retryable ENGINE_UNAVAILABLE
    error batch (another engine continues the output)."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD + chunk(vllm_event([5, 6])))
        await writer.drain()
        await server.go.wait()
        reset(writer)
        return False

    async with tiny(answer) as server, client() as http:
        batches = await relay_from(server, http, on_batch=lambda b: server.go.set())
    assert [b.token_ids for b in batches] == [[5, 6], []]
    last = batches[-1]
    assert last.done and last.finish_reason == "error" and last.error is not None
    assert (last.error.code, last.error.retryable) == (ErrorCode.ENGINE_UNAVAILABLE, True)


async def relay_engine_stalled() -> None:
    """The engine stops sending: a TIMEOUT error batch after the read time."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD + chunk(vllm_event([5])))
        await writer.drain()
        await server.over.wait()
        return False

    async with tiny(answer) as server, client() as http:
        batches = await relay_from(server, http, read_timeout=0.2)
    last = batches[-1]
    assert [b.token_ids for b in batches] == [[5], []]
    assert last.done and last.error is not None and last.error.code == ErrorCode.TIMEOUT


async def relay_one_batch_per_read() -> None:
    """Events that arrive in one read make one batch; the finishing chunk waits for usage,
    and the connection, read to its end, is reused."""
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
    first = b"".join(chunk(vllm_event([i])) for i in (7, 8, 9))
    rest = chunk(vllm_event([200002], "stop")) + chunk(usage) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD + first)
        await writer.drain()
        await server.go.wait()
        server.go.clear()
        writer.write(rest)
        await writer.drain()
        return True

    async with tiny(answer) as server, client() as http:
        batches = await relay_from(server, http, on_batch=lambda b: server.go.set())
        assert http.connections == 1
    assert [b.token_ids for b in batches] == [[7, 8, 9], [200002]]
    last = batches[-1]
    assert (last.done, last.finish_reason, last.stop_token_id) == (True, "stop", 200002)
    assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 4)


SCENARIOS = [relay_engine_died, relay_engine_stalled, relay_one_batch_per_read]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
async def test_on_asyncio(scenario: Callable[[], Awaitable[None]]) -> None:
    await scenario()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """uvloop calls the protocol at other moments (``connection_made`` after
    ``create_connection`` returned, for one): the same cases, on the services' loop."""
    on_uvloop(scenario)
