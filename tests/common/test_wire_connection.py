"""``Wire``'s connection against nats-servers of the test's own: a login with a user and password
(as options or in the URL; a wrong one refused), a reconnect after the server is killed
(subscriptions made again, what was published meanwhile sent), and a stale connection (the
server SIGSTOPped) noticed by unanswered PINGs and replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from urllib.parse import quote

import nats
import nats.errors
import pytest

from services.common.infra import ManagedProcess, free_port, start_nats
from services.common.wire import Wire
from tests.common.wire_support import Collector, Connect, Hooks


class Servers:
    """Private nats-servers for one test; all resumed (if SIGSTOPped) and stopped at its end."""

    def __init__(self) -> None:
        self.procs: list[ManagedProcess] = []
        self.pid = 0  # the newest server's

    async def start(self, port: int | None = None, credentials: tuple[str, str] | None = None) -> tuple[int, str]:
        port = port or free_port()
        proc, url = await asyncio.to_thread(start_nats, port, credentials=credentials)
        assert proc.proc is not None
        self.procs.append(proc)
        self.pid = proc.proc.pid
        return port, url

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.proc is not None and proc.alive():
                os.kill(proc.proc.pid, signal.SIGCONT)  # a stopped server would not stop
            proc.stop()


@pytest.fixture
def servers() -> Iterator[Servers]:
    owned = Servers()
    yield owned  # and after the test, whatever its outcome:
    owned.stop_all()


# auth -----------------------------------------------------------------------------------
async def test_user_and_password(servers: Servers, connect: Connect, subject: str) -> None:
    user, password = 'chorus "svc" user', 'p a\'ss "w" d'
    port, url = await servers.start(credentials=(user, password))
    wire = await connect(url, user=user, password=password)
    in_url = await connect(f"nats://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{port}")
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.flush()
    await in_url.publish(subject, b"authorised")
    assert (await col.wait(1))[0].data == b"authorised"
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    for wrong in ({"user": user, "password": "wrong"}, {}):
        with pytest.raises(nats.errors.NoServersError) as refused:
            await Wire.connect(url, error_cb=on_error, **wrong)
        assert "Authorization Violation" in str(refused.value.__cause__)
    assert errors and all("Authorization Violation" in str(e) for e in errors)


# keeping the connection -----------------------------------------------------------------
async def test_reconnects_resubscribes_and_sends_what_was_published_meanwhile(
    servers: Servers, connect: Connect, subject: str
) -> None:
    port, url = await servers.start()
    hooks = Hooks()
    wire = await connect(url, reconnect_time_wait=0.1, **hooks.options)
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.publish(subject, b"before")
    await col.wait(1)
    os.kill(servers.pid, signal.SIGKILL)
    async with asyncio.timeout(5):
        await hooks.disconnected.wait()
    assert not wire.is_connected and not wire.is_closed
    await wire.publish(subject, b"while down")  # queued, not an error
    await servers.start(port)
    async with asyncio.timeout(5):
        await hooks.reconnected.wait()
    assert wire.is_connected and hooks.calls == ["disconnected", "reconnected"]
    await col.wait(2)  # sent after the reconnect, to the subscription made again
    other = await nats.connect(url)
    try:
        await other.publish(subject, b"after")
        await other.flush()
    finally:
        await other.close()
    await col.wait(3)
    assert col.data == [b"before", b"while down", b"after"]
    await wire.flush()


async def test_a_stale_connection_is_noticed_and_replaced(servers: Servers, connect: Connect, subject: str) -> None:
    _, url = await servers.start()
    hooks = Hooks()
    wire = await connect(url, ping_interval=0.2, max_outstanding_pings=2, reconnect_time_wait=0.1, **hooks.options)
    col = Collector()
    await wire.subscribe(subject, cb=col.record)
    await wire.flush()
    os.kill(servers.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        async with asyncio.timeout(3):
            await hooks.disconnected.wait()
        assert 0.3 <= time.monotonic() - stopped <= 2.0  # after unanswered PINGs, not at once
        assert not wire.is_connected
    finally:
        os.kill(servers.pid, signal.SIGCONT)
    async with asyncio.timeout(10):
        await hooks.reconnected.wait()
    await wire.publish(subject, b"back")
    assert (await col.wait(1))[0].data == b"back"
    await wire.flush()
