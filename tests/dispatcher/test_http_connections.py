"""The dispatcher's engine HTTP client keeping connections, against a scripted local server:
reuse, what ends a connection (the engine closing it while idle or as it is reused, a stream
cut short, ``connection: close``), the connection limit, each on the default event loop and on
uvloop; and HTTPS, with a certificate the client trusts and one it does not."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from services.dispatcher.engines.http import AcceptTimeout, ConnectFailed
from tests.dispatcher.tiny_server import SSE_HEAD, Tiny, answer_with, chunk, client, kept, on_uvloop, tiny


# scripted cases (each runs on asyncio and on uvloop) ----------------------------------------
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


SCENARIOS = [
    keep_alive,
    idle_closed_by_the_engine,
    closed_as_it_is_reused,
    cut_short_is_not_reused,
    connection_close_header,
    connection_limit,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
async def test_on_asyncio(scenario: Callable[[], Awaitable[None]]) -> None:
    await scenario()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """uvloop calls the protocol at other moments (``connection_made`` after
    ``create_connection`` returned, for one): the same cases, on the services' loop."""
    on_uvloop(scenario)


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
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_path.write_bytes(pem)
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
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
