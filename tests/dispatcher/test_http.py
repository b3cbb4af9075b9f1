"""The dispatcher's engine HTTP client reading answers, against real local servers: bodies in
every framing (chunked, Content-Length, until close), an informational answer before the real
one, a server that does not speak HTTP, and the failures an engine causes (resets, silence,
stalls, closing before answering) or the consumer does; each on the default event loop and on
uvloop (what the services run on). Then the simulated engine (uvicorn) end to end. Connection
reuse is in test_http_connections.py, the relay to token batches in test_http_relay.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest

from services.common.infra import free_port
from services.dispatcher.engines.http import AcceptTimeout, BadResponse, ConnectFailed, ConnectionBroken, ReadTimeout
from services.simengine.app import RunningSim, serving
from services.simengine.settings import Settings as SimSettings
from tests.dispatcher.tiny_server import (
    SSE_HEAD,
    Tiny,
    answer_with,
    chunk,
    client,
    kept,
    on_uvloop,
    reset,
    silent,
    tiny,
)
from tests.simengine.prompts import user_prompt


# bodies ------------------------------------------------------------------------------------
async def chunked_body() -> None:
    """A chunked stream arrives whole, whatever the reads cut it into; the request is a
    POST with the JSON body and its length."""
    events = [b'data: {"n": %d}\n\n' % i for i in range(20)] + [b"data: [DONE]\n\n"]
    wire = SSE_HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n"

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        for i in range(0, len(wire), 7):  # cut anywhere: chunk sizes, CRLFs, headers
            writer.write(wire[i : i + 7])
            await writer.drain()
        return True

    got = bytearray()
    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/v1/completions?x=1", b'{"a": 1}', accept_timeout=5, read_timeout=5)
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        stream.start(got.extend)
        await stream.done
        stream.close()
    assert bytes(got) == b"".join(events)
    port = server.url.rsplit(":", 1)[1]
    assert server.requests == [
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n"
        b'Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{"a": 1}' % port.encode()
    ]


async def content_length_body() -> None:
    """A Content-Length body sent in parts; ``request`` reads it whole; so does ``read_all``
    on an error status."""
    body = b'{"object": "list", "data": []}'

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        whole = answer_with(body, status=200 if n == 1 else 503)
        writer.write(whole[:40])
        await writer.drain()
        writer.write(whole[40:])
        return True

    async with tiny(answer) as server, client() as http:
        assert await http.request("GET", f"{server.url}/v1/models", timeout=5) == (200, body)
        stream = await http.stream(f"{server.url}/generate", b"{}", accept_timeout=5, read_timeout=5)
        assert stream.status == 503
        assert await stream.read_all() == body
        stream.close()
    assert server.requests[0].startswith(b"GET /v1/models HTTP/1.1\r\n")
    assert b"content-length" not in server.requests[0].lower()


async def body_until_close() -> None:
    """Neither length nor chunks: the body ends with the connection, which is not reused."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()
        return False

    async with tiny(answer) as server, client() as http:
        for _ in range(2):
            assert await http.request("GET", f"{server.url}/health", timeout=5) == (200, b"all of it")
    assert server.accepted == 2


async def informational_first() -> None:
    """An informational answer (103) before the real one is skipped."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
        await writer.drain()
        writer.write(answer_with(b"ok", extra=b"x-real: 1\r\n"))
        await writer.drain()
        return True

    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)
        assert (stream.status, stream.headers.get("x-real"), "link" in stream.headers) == (200, "1", False)
        assert await stream.read_all() == b"ok"
        stream.close()
        assert await http.request("GET", f"{server.url}/x", timeout=5) == (200, b"ok")
    assert server.accepted == 1


async def not_http() -> None:
    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        return True

    async with tiny(answer) as server, client() as http:
        with pytest.raises(BadResponse):
            await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)


# failures ----------------------------------------------------------------------------------
async def reset_mid_body() -> None:
    """The engine's connection reset after the headers and some of the body: ``done`` fails
    with a retryable ``ConnectionBroken``."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        await server.go.wait()
        reset(writer)
        return False

    got = asyncio.Event()
    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)
        stream.start(lambda data: got.set())
        await got.wait()
        server.go.set()
        with pytest.raises(ConnectionBroken) as broken:
            await stream.done
        stream.close()
    assert broken.value.retryable


async def never_answers() -> None:
    """Accepted, read, never answered: ``AcceptTimeout`` after the accept time."""
    async with tiny(silent) as server, client() as http:
        t0 = time.monotonic()
        with pytest.raises(AcceptTimeout) as timeout:
            await http.stream(f"{server.url}/x", b"{}", accept_timeout=0.2, read_timeout=5)
        elapsed = time.monotonic() - t0
    assert not timeout.value.retryable
    assert 0.15 < elapsed < 2, elapsed


async def stalls() -> None:
    """Headers and one event, then nothing: ``ReadTimeout`` after the read time."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        await server.over.wait()
        return False

    got = bytearray()
    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=0.2)
        stream.start(got.extend)
        t0 = time.monotonic()
        with pytest.raises(ReadTimeout):
            await stream.done
        elapsed = time.monotonic() - t0
        stream.close()
    assert got == b"data: {}\n\n"
    assert elapsed < 2, elapsed


async def closed_before_answering() -> None:
    """A new connection closed before any byte of answer: ``ConnectFailed`` (retryable: another
    engine may take the request), and the request is not sent again."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    async with tiny(answer) as server, client() as http:
        with pytest.raises(ConnectFailed) as failed:
            await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)
    assert failed.value.retryable and server.accepted == 1


async def refused() -> None:
    async with client() as http:
        with pytest.raises(ConnectFailed) as failed:
            await http.stream(f"http://127.0.0.1:{free_port()}/x", b"{}", accept_timeout=5, read_timeout=5)
    assert failed.value.retryable


async def consumer_failure() -> None:
    """The callback's exception fails ``done``; the connection is not reused."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        if server.accepted > 1:
            return await kept(server, writer, n)
        writer.write(SSE_HEAD)
        await writer.drain()
        await server.go.wait()
        writer.write(chunk(b"data: {}\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return True

    def explode(data: bytes) -> None:
        raise ValueError("the consumer broke")

    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)
        stream.start(explode)
        server.go.set()
        with pytest.raises(ValueError, match="the consumer broke"):
            await stream.done
        stream.close()
        assert await http.request("GET", f"{server.url}/x", timeout=5) == (200, b'{"n": 1}')
    assert server.accepted == 2


SCENARIOS = [
    chunked_body,
    content_length_body,
    body_until_close,
    informational_first,
    not_http,
    reset_mid_body,
    never_answers,
    stalls,
    closed_before_answering,
    refused,
    consumer_failure,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
async def test_on_asyncio(scenario: Callable[[], Awaitable[None]]) -> None:
    await scenario()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """uvloop calls the protocol at other moments (``connection_made`` after
    ``create_connection`` returned, for one): the same cases, on the services' loop."""
    on_uvloop(scenario)


# the simulated engine (uvicorn) ---------------------------------------------------------------
@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both", tokens_per_chunk=2)) as running:
        yield running


async def test_against_the_simulated_engine(sim: RunningSim) -> None:
    """Health, a chunked completion stream to its ``[DONE]``, an error status read whole; all
    on one kept connection."""
    body = orjson.dumps(
        {"model": "m", "prompt": user_prompt("hi"), "stream": True, "return_token_ids": True, "max_tokens": 8}
    )
    async with client() as http:
        assert (await http.request("GET", f"{sim.url}/health", timeout=5))[0] == 200
        for _ in range(2):
            got = bytearray()
            stream = await http.stream(f"{sim.url}/v1/completions", body, accept_timeout=5, read_timeout=5)
            assert stream.status == 200 and stream.headers["transfer-encoding"] == "chunked"
            stream.start(got.extend)
            await stream.done
            stream.close()
            assert got.endswith(b"data: [DONE]\n\n") and got.count(b"token_ids") >= 4
        failing = orjson.dumps({"model": "m", "prompt": user_prompt("x [[sim:status=503]]"), "stream": True})
        stream = await http.stream(f"{sim.url}/v1/completions", failing, accept_timeout=5, read_timeout=5)
        assert stream.status == 503 and b"error" in await stream.read_all()
        stream.close()
        assert http.connections == 1
