"""``Wire``'s logins against real nats-servers: a token (option or URL), user and password, an
nkey (the server configured with the public key of a seed made here), a creds file (an
operator, an account and a user, their JWTs issued here, the server in operator mode), and a
refusal of each as a one-line error naming the server."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from services.common.wire import NoServersAnswered, Wire
from services.common.wire_auth import KeyPair
from tests.common.test_wire_servers import NatsServers, nats_servers, seed
from tests.common.wire_support import Collector

__all__ = ["nats_servers"]  # the fixture, shared

Connect = Callable[..., Awaitable[Wire]]


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


async def works(wire: Wire) -> None:
    subject = f"auth.{uuid.uuid4().hex}"
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.publish(subject, b"in")
    await col.wait(1)
    assert col.data == [b"in"]


async def refused(url: str, **options: Any) -> str:
    """The error ``connect`` raises: one line naming the server and the server's refusal."""
    started = time.monotonic()
    with pytest.raises(NoServersAnswered) as failure:
        await Wire.connect(url, **options)
    assert time.monotonic() - started < 1.5  # refused, not timed out
    message = str(failure.value)
    assert "\n" not in message and url.rsplit("@", 1)[-1].split("://")[-1] in message, message
    assert "Authorization Violation" in message and "login refused" in message, message
    return message


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jwt(issuer: KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT (v2): ``ed25519-nkey``, signed by ``issuer``."""
    claims: dict[str, Any] = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject}
    claims["nats"] = {**nats, "version": 2}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode().rstrip("=")
    head = b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = b64(json.dumps(claims).encode())
    return f"{head}.{body}.{issuer.sign(f'{head}.{body}'.encode())}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1}


class Operator:
    """An operator, one account and its users, as ``nsc`` would make them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.operator = KeyPair.from_seed(seed("operator"))
        self.account = KeyPair.from_seed(seed("account"))
        self.operator_jwt = jwt(self.operator, self.operator.public, "chorus-op", {"type": "operator"})
        limits = {**UNLIMITED, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}
        self.account_jwt = jwt(self.operator, self.account.public, "chorus", {"type": "account", "limits": limits})

    def config(self) -> str:
        path = self.directory / "operator.jwt"
        path.write_text(self.operator_jwt)
        return f'operator: "{path}"\nresolver: MEMORY\nresolver_preload: {{\n  {self.account.public}: "{self.account_jwt}"\n}}\n'

    def creds(self, name: str, *, signer: KeyPair | None = None) -> Path:
        """A creds file for a new user (issued by the account, or by ``signer``)."""
        user_seed = seed()
        user = KeyPair.from_seed(user_seed)
        token = jwt(signer or self.account, user.public, name, {"type": "user", "pub": {}, "sub": {}, **UNLIMITED})
        path = self.directory / f"{name}.creds"
        path.write_text(
            f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n"
        )
        return path


async def test_token(nats_servers: NatsServers, connect: Connect) -> None:
    node = await nats_servers.start('authorization { token: "s3cret t0ken" }')
    await works(await connect(node.url, token="s3cret t0ken"))
    await works(await connect(f"nats://{quote('s3cret t0ken')}@127.0.0.1:{node.port}"))
    await refused(node.url, token="wrong")
    message = await refused(node.url)
    assert f"nats://127.0.0.1:{node.port}: login refused (no credentials): Authorization Violation" in message


async def test_user_and_password(nats_servers: NatsServers, connect: Connect) -> None:
    node = await nats_servers.start('authorization { user: "svc", password: "pa ss" }')
    await works(await connect(node.url, user="svc", password="pa ss"))
    await works(await connect(f"nats://svc:{quote('pa ss')}@127.0.0.1:{node.port}"))
    message = await refused(node.url, user="svc", password="wrong")
    assert message == (
        f"nats: no server could be connected to: nats://127.0.0.1:{node.port}: "
        "login refused (user 'svc'): Authorization Violation"
    )
    assert "wrong" not in message
    assert "svc:wrong" not in await refused(f"nats://svc:wrong@127.0.0.1:{node.port}")


async def test_nkey(nats_servers: NatsServers, connect: Connect, tmp_path: Path) -> None:
    user_seed = seed()
    public = KeyPair.from_seed(user_seed).public
    node = await nats_servers.start(f'authorization {{ users: [ {{ nkey: "{public}" }} ] }}')
    seed_file = tmp_path / "user.nk"
    seed_file.write_text(user_seed + "\n")
    await works(await connect(node.url, nkeys_seed=seed_file))
    await works(await connect(node.url, nkeys_seed_str=user_seed))
    stranger = KeyPair.from_seed(other := seed()).public
    message = await refused(node.url, nkeys_seed_str=other)
    assert f"login refused (nkey {stranger})" in message and other not in message
    with pytest.raises(ValueError):
        Wire([node.url], nkeys_seed_str=public)  # a public key is not a seed: said at once


async def test_creds_file(nats_servers: NatsServers, connect: Connect, tmp_path: Path) -> None:
    operator = Operator(tmp_path)
    node = await nats_servers.start(operator.config())
    await works(await connect(node.url, user_credentials=operator.creds("alice")))
    impostor = KeyPair.from_seed(seed("account"))  # an account the server does not know
    forged = operator.creds("mallory", signer=impostor)
    message = await refused(node.url, user_credentials=forged)
    assert f"login refused (creds file {forged})" in message
    with pytest.raises(ValueError):
        Wire([node.url], user_credentials=tmp_path / "operator.jwt")  # not a creds file


async def test_a_refused_server_is_skipped_for_one_that_accepts(nats_servers: NatsServers, connect: Connect) -> None:
    strict = await nats_servers.start('authorization { token: "other" }')
    open_ = await nats_servers.start()
    wire = await connect(f"{strict.url},{open_.url}", token="mine", dont_randomize=True)
    assert wire.pool.current is not None and wire.pool.current.port == open_.port
    await works(wire)
