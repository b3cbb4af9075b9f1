"""The dispatcher's engine HTTP client against real local servers: the simulated engine
(uvicorn), and a tiny asyncio server scripted per case for what an engine rarely does on
purpose (resets, stalls, silence, closing idle connections). The scripted cases run on the
default event loop and on uvloop (what the services run on)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import socket
import ssl
import struct
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import uvloop

from contracts.errors import ErrorCode
from contracts.messages.generate import (
    GenerateRequest,
    ParseSpec,
    Route,
    SamplingParams,
    TokenBatch,
)
from services.common.infra import free_port
from services.dispatcher.batches import BatchWriter, relay
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.http import (
    AcceptTimeout,
    BadResponse,
    ConnectFailed,
    ConnectionBroken,
    EngineHttp,
    ReadTimeout,
)
from services.dispatcher.engines.stream import open_stream
from services.simengine.app import RunningSim, serving
from services.simengine.settings import Settings as SimSettings
from tests.simengine.prompts import user_prompt

SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def answer_with(body: bytes, *, status: int = 200, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


# the tiny server ---------------------------------------------------------------------------
@dataclass
class Tiny:
    """A scripted HTTP/1.1 server: ``answer(server, writer, n)`` answers the n-th request (from
    1) on a connection and says whether to keep the connection."""

    answer: Callable[[Tiny, asyncio.StreamWriter, int], Awaitable[bool]]
    url: str = ""
    accepted: int = 0  # connections
    requests: list[bytes] = field(default_factory=list)  # as received, head and body
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection ended
    go: asyncio.Event = field(default_factory=asyncio.Event)  # the test lets a script go on
    over: asyncio.Event = field(default_factory=asyncio.Event)  # the test is over
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.accepted += 1
        try:
            n = 0
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                self.requests.append(head + await reader.readexactly(length))
                n += 1
                if not await self.answer(self, writer, n):
                    return
        finally:
            writer.close()
            self.closed.set()


@contextlib.asynccontextmanager
async def tiny(answer: Callable[[Tiny, asyncio.StreamWriter, int], Awaitable[bool]],
               ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[Tiny]:
    state = Tiny(answer)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    state.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()
        state.over.set()  # scripts waiting for nothing end; the client closed its connections
        await asyncio.gather(*state.tasks)


@contextlib.asynccontextmanager
async def client(**kw: object) -> AsyncIterator[EngineHttp]:
    http = EngineHttp(**kw)  # type: ignore[arg-type]
    try:
        yield http
    finally:
        await http.close()


async def kept(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
    """A short JSON answer; the connection stays open."""
    writer.write(answer_with(b'{"n": %d}' % n))
    await writer.drain()
    return True


async def silent(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
    await server.over.wait()
    return False


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, not a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# scripted cases (each runs on asyncio and on uvloop) ----------------------------------------
async def chunked_body() -> None:
    """A chunked stream arrives whole, whatever the reads cut it into; the request is a
    POST with the JSON body and its length."""
    events = [b"data: {\"n\": %d}\n\n" % i for i in range(20)] + [b"data: [DONE]\n\n"]
    wire = SSE_HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n"

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        for i in range(0, len(wire), 7):  # cut anywhere: chunk sizes, CRLFs, headers
            writer.write(wire[i:i + 7])
            await writer.drain()
        return True

    got = bytearray()
    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/v1/completions?x=1", b'{"a": 1}',
                                   accept_timeout=5, read_timeout=5)
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        stream.start(got.extend)
        await stream.done
        stream.close()
    assert bytes(got) == b"".join(events)
    port = server.url.rsplit(":", 1)[1]
    assert server.requests == [
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n"
        b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"a\": 1}" % port.encode()]


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


async def keep_alive() -> None:
    """Sequential requests share one connection."""
    async with tiny(kept) as server, client() as http:
        for i in (1, 2, 3):
            assert await http.request("POST", f"{server.url}/x", b"{}", timeout=5) == (200, b'{"n": %d}' % i)
        assert http.connections == 1
    assert server.accepted == 1 and len(server.requests) == 3


async def idle_closed_by_the_engine() -> None:
    """The engine closes an idle connection (as uvicorn does after its keep-alive time): the
    next request still succeeds, on a new connection."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(answer_with(b"ok"))  # no "connection: close": the client cannot know
        await writer.drain()
        return False

    async with tiny(answer) as server, client() as http:
        assert await http.request("GET", f"{server.url}/health", timeout=5) == (200, b"ok")
        await server.closed.wait()
        assert await http.request("GET", f"{server.url}/health", timeout=5) == (200, b"ok")
    assert server.accepted == 2


async def closed_as_it_is_reused() -> None:
    """The race the idle check cannot see: the engine closes a kept connection just as the
    next request arrives on it. That request is sent once more, on a new connection."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            return False  # closed without a byte of answer
        return await kept(server, writer, n)

    async with tiny(answer) as server, client() as http:
        for _ in range(2):
            assert (await http.request("POST", f"{server.url}/x", b"{}", timeout=5))[0] == 200
    assert server.accepted == 2 and len(server.requests) == 3


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


async def cut_short_is_not_reused() -> None:
    """A stream closed before its end closes its connection (for vLLM that is the abort); the
    engine sees it closed, and the next request opens another."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        if server.accepted > 1:
            return await kept(server, writer, n)
        writer.write(SSE_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        return True  # the next read sees the client close

    async with tiny(answer) as server, client() as http:
        stream = await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)
        stream.close()
        await server.closed.wait()
        assert (await http.request("GET", f"{server.url}/x", timeout=5))[0] == 200
    assert server.accepted == 2


async def connection_close_header() -> None:
    """An answer saying ``connection: close`` is not followed by another on its connection."""

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(answer_with(b"ok", extra=b"connection: close\r\n"))
        await writer.drain()
        return True

    async with tiny(answer) as server, client() as http:
        for _ in range(2):
            assert await http.request("GET", f"{server.url}/x", timeout=5) == (200, b"ok")
    assert server.accepted == 2


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


async def connection_limit() -> None:
    """At ``max_connections`` answers in hand, the next request waits for one to be closed."""
    async with tiny(kept) as server, client(max_connections=1) as http:
        first = await http.stream(f"{server.url}/x", b"{}", accept_timeout=5, read_timeout=5)
        with pytest.raises(AcceptTimeout):
            await http.stream(f"{server.url}/x", b"{}", accept_timeout=0.1, read_timeout=5)
        waiting = asyncio.ensure_future(http.request("GET", f"{server.url}/x", timeout=5))
        await first.read_all()
        assert not waiting.done()
        first.close()
        assert await waiting == (200, b'{"n": 2}')
    assert server.accepted == 1


def vllm_event(ids: list[int], finish: str | None = None) -> bytes:
    event = {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def generate_request(rid: str) -> GenerateRequest:
    return GenerateRequest(
        generation_id=rid, model="openai/gpt-oss-20b", prompt_token_ids=[1, 2, 3],
        stop_token_ids=[200002], parse=ParseSpec(request_id=rid),
        route=Route(gateway="g", parser="p"), deadline=2e9, sampling=SamplingParams(),
    )


async def relay_from(server: Tiny, http: EngineHttp, *, read_timeout: float = 5,
                     on_batch: Callable[[TokenBatch], None] | None = None) -> list[TokenBatch]:
    req = generate_request("r1")
    batches: list[TokenBatch] = []

    def put(batch: TokenBatch, urgent: bool) -> None:
        batches.append(batch)
        if on_batch is not None:
            on_batch(batch)

    stream = await open_stream(http, server.url, make_adapter("vllm"), req,
                               accept_timeout=5, read_timeout=read_timeout)
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


SCENARIOS = [
    chunked_body, content_length_body, body_until_close, reset_mid_body, never_answers, stalls,
    keep_alive, idle_closed_by_the_engine, closed_as_it_is_reused, closed_before_answering, refused,
    cut_short_is_not_reused, connection_close_header, consumer_failure, informational_first,
    not_http, connection_limit,
    relay_engine_died, relay_engine_stalled, relay_one_batch_per_read,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
async def test_on_asyncio(scenario: Callable[[], Awaitable[None]]) -> None:
    await scenario()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """uvloop calls the protocol at other moments (``connection_made`` after
    ``create_connection`` returned, for one): the same cases, on the services' loop."""
    async def bounded() -> None:  # a hung thread would hang the session
        async with asyncio.timeout(30):
            await scenario()

    with ThreadPoolExecutor(1) as pool:  # a thread: the test session's loop stays as it is
        pool.submit(uvloop.run, bounded()).result()


# https ---------------------------------------------------------------------------------------
def self_signed() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for 127.0.0.1, and a client context trusting it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_path.write_bytes(pem)
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert_path, key_path)
    return server, ssl.create_default_context(cadata=pem.decode())


async def test_https() -> None:
    pytest.importorskip("cryptography")
    server_ctx, client_ctx = self_signed()
    async with tiny(kept, ssl_context=server_ctx) as server, client(ssl_context=client_ctx) as http:
        for i in (1, 2):
            assert await http.request("GET", f"{server.url}/x", timeout=5) == (200, b'{"n": %d}' % i)
    assert server.accepted == 1
    async with tiny(kept, ssl_context=server_ctx) as server, client() as http:  # not trusted
        with pytest.raises(ConnectFailed, match="SSL"):
            await http.request("GET", f"{server.url}/x", timeout=5)


# the simulated engine (uvicorn) ---------------------------------------------------------------
@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both", tokens_per_chunk=2)) as running:
        yield running


async def test_against_the_simulated_engine(sim: RunningSim) -> None:
    """Health, a chunked completion stream to its ``[DONE]``, an error status read whole; all
    on one kept connection."""
    body = orjson.dumps({"model": "m", "prompt": user_prompt("hi"), "stream": True,
                         "return_token_ids": True, "max_tokens": 8})
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
