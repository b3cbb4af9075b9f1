"""``Wire`` over TLS against real nats-servers with certificates from a CA made for the module:
the server verified (CA file, host name), refused with a clear error when it cannot be, mutual
TLS, a ``nats://`` URL upgraded when the server requires TLS, and TLS-first servers."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from services.common.wire import Msg, NoServersAnswered, Wire, tls_context
from tests.common.test_wire_servers import Authority, Issued, NatsServers, nats_servers
from tests.common.wire_support import Collector

__all__ = ["nats_servers"]  # the fixture, shared

Connect = Callable[..., Awaitable[Wire]]


class Pki:
    def __init__(self, directory: Path) -> None:
        self.authority = Authority(directory)
        self.ca = self.authority.ca
        self.server = self.authority.issue("server", hosts=("127.0.0.1", "localhost"))
        self.named = self.authority.issue("named", hosts=("nats.chorus.test",))  # no address in it
        self.client = self.authority.issue("client", client=True)
        self.wrong_ca = Authority(directory, "Another CA").ca


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def tls_block(cert: Issued, *, ca: Path | None = None, extra: str = "") -> str:
    verify = f'  ca_file: "{ca}"\n  verify: true\n' if ca else ""
    return f'tls {{\n  cert_file: "{cert.cert}"\n  key_file: "{cert.key}"\n{verify}{extra}  timeout: 2\n}}\n'


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    opened: list[Wire] = []

    async def open_wire(url: str, **options: Any) -> Wire:
        wire = await Wire.connect(url, **options)
        opened.append(wire)
        return wire

    yield open_wire
    for wire in opened:
        await wire.close()


def encrypted(wire: Wire) -> bool:
    assert wire._proto is not None and wire._proto.transport is not None
    return wire._proto.transport.get_extra_info("ssl_object") is not None


async def round_trip(wire: Wire) -> None:
    """Publish, subscribe and request/reply over ``wire``."""
    subject = f"tls.{uuid.uuid4().hex}"
    col = Collector()
    await wire.subscribe(subject, cb=col.record)

    async def answer(msg: Msg) -> None:
        await msg.respond(b"re:" + msg.data)

    await wire.subscribe(f"{subject}.ask", cb=answer)
    await wire.flush()
    await wire.publish(subject, b"secret")
    await col.wait(1)
    assert col.data == [b"secret"]
    assert (await wire.request(f"{subject}.ask", b"q", timeout=2)).data == b"re:q"


async def refusal(url: str, **options: Any) -> str:
    """The one-line error ``connect`` raises."""
    with pytest.raises(NoServersAnswered) as refused:
        await Wire.connect(url, connect_timeout=2, **options)
    message = str(refused.value)
    assert "\n" not in message and url.split("://")[1] in message
    return message


async def test_a_tls_url_verifies_the_server_with_the_ca(nats_servers: NatsServers, pki: Pki, connect: Connect) -> None:
    node = await nats_servers.start(tls_block(pki.server))
    wire = await connect(f"tls://127.0.0.1:{node.port}", tls=tls_context(ca=pki.ca))
    assert encrypted(wire) and wire.server_info["tls_required"]
    await round_trip(wire)
    by_name = await connect(f"tls://localhost:{node.port}", tls=tls_context(ca=pki.ca))
    await round_trip(by_name)


async def test_a_server_requiring_tls_upgrades_a_nats_url(
    nats_servers: NatsServers, pki: Pki, connect: Connect
) -> None:
    node = await nats_servers.start(tls_block(pki.server))
    wire = await connect(node.url, tls=tls_context(ca=pki.ca))  # INFO says tls_required
    assert encrypted(wire)
    await round_trip(wire)
    # no context given: the system's trust store, which does not know this CA
    message = await refusal(node.url)
    assert "certificate was refused" in message and "local issuer" in message


async def test_a_server_not_signed_by_the_ca_is_refused(nats_servers: NatsServers, pki: Pki) -> None:
    node = await nats_servers.start(tls_block(pki.server))
    message = await refusal(f"tls://127.0.0.1:{node.port}", tls=tls_context(ca=pki.wrong_ca))
    assert message.startswith("nats: no server could be connected to: tls://127.0.0.1:")
    assert "TLS: the server's certificate was refused: unable to get local issuer certificate" in message


async def test_the_certificate_must_name_the_host(nats_servers: NatsServers, pki: Pki, connect: Connect) -> None:
    node = await nats_servers.start(tls_block(pki.named))
    url = f"tls://127.0.0.1:{node.port}"
    assert "mismatch" in await refusal(url, tls=tls_context(ca=pki.ca))
    wire = await connect(url, tls=tls_context(ca=pki.ca), tls_hostname="nats.chorus.test")
    await round_trip(wire)


async def test_mutual_tls_needs_the_client_certificate(nats_servers: NatsServers, pki: Pki, connect: Connect) -> None:
    node = await nats_servers.start(tls_block(pki.server, ca=pki.ca))
    url = f"tls://127.0.0.1:{node.port}"
    wire = await connect(url, tls=tls_context(ca=pki.ca, cert=pki.client.cert, key=pki.client.key))
    await round_trip(wire)
    message = await refusal(url, tls=tls_context(ca=pki.ca))
    assert "certificate required" in message or "handshake failure" in message, message
    with pytest.raises(ValueError):
        tls_context(key=pki.client.key)  # a key without its certificate


async def test_handshake_first(nats_servers: NatsServers, pki: Pki, connect: Connect) -> None:
    node = await nats_servers.start(tls_block(pki.server, extra="  handshake_first: true\n"))
    wire = await connect(f"tls://127.0.0.1:{node.port}", tls=tls_context(ca=pki.ca), tls_handshake_first=True)
    assert encrypted(wire)
    await round_trip(wire)


async def test_tls_asked_for_on_a_plain_server_is_an_error(nats_servers: NatsServers, pki: Pki) -> None:
    node = await nats_servers.start()
    message = await refusal(f"tls://127.0.0.1:{node.port}", tls=tls_context(ca=pki.ca))
    assert "TLS was asked for but the server does not offer it" in message


async def test_reconnects_over_tls(nats_servers: NatsServers, pki: Pki, connect: Connect) -> None:
    node = await nats_servers.start(tls_block(pki.server))
    disconnected, reconnected = asyncio.Event(), asyncio.Event()

    async def on_disconnect() -> None:
        disconnected.set()

    async def on_reconnect() -> None:
        reconnected.set()

    wire = await connect(
        f"tls://127.0.0.1:{node.port}",
        tls=tls_context(ca=pki.ca),
        reconnect_time_wait=0.1,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )
    col = Collector()
    subject = f"tls.{uuid.uuid4().hex}"
    await wire.subscribe(subject, cb=col.record)
    await wire.flush()
    node.proc.stop(timeout=2)
    async with asyncio.timeout(5):
        await disconnected.wait()
    await wire.publish(subject, b"while down")
    await nats_servers.start(tls_block(pki.server), port=node.port)
    async with asyncio.timeout(5):
        await reconnected.wait()
    await col.wait(1)
    assert encrypted(wire) and col.data == [b"while down"]
    with pytest.raises(nats.errors.MaxPayloadError):
        await wire.publish(subject, b"x" * (wire.max_payload + 1))


def test_a_context_from_files_verifies_by_default(pki: Pki) -> None:
    context = tls_context(ca=pki.ca)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
