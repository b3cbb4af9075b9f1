"""Services authenticate to a NATS server that requires it (the compose stack's) with
CHORUS_NATS_USER / CHORUS_NATS_PASSWORD, passed as options (a password with spaces works)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from services.common.bus import connect
from services.common.infra import free_port, start_nats
from services.common.runtime import make_broker
from services.common.settings import BusSettings

PASSWORD = "s3cret word 'x' }"


@pytest.fixture
def auth_nats() -> Iterator[str]:
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "--user", "chorus", "--pass", PASSWORD],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_services_connect_with_credentials_and_not_without(
    auth_nats: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asyncio.sleep(0.3)  # the server starts
    monkeypatch.setenv("CHORUS_NATS_USER", "chorus")
    monkeypatch.setenv("CHORUS_NATS_PASSWORD", PASSWORD)
    nc = await connect(auth_nats, "auth-test")
    assert nc.is_connected
    await nc.close()
    monkeypatch.delenv("CHORUS_NATS_USER")
    with pytest.raises(Exception):  # noqa: B017 - refused (and retried until the timeout)
        await asyncio.wait_for(connect(auth_nats, "no-auth-test"), 3)


async def test_the_nats_of_chorus_up_admits_only_its_own_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """``chorus up`` starts its own NATS (none answered) with a password made for the run and
    hands it to its services: a client without it is refused."""
    proc, url = start_nats(credentials=("chorus", PASSWORD))
    try:
        assert PASSWORD not in " ".join(proc.args)  # argv is readable by every local user
        monkeypatch.delenv("CHORUS_NATS_USER", raising=False)
        with pytest.raises(Exception):  # noqa: B017 - refused (and retried until the timeout)
            await asyncio.wait_for(connect(url, "stranger"), 3)
        monkeypatch.setenv("CHORUS_NATS_USER", "chorus")
        monkeypatch.setenv("CHORUS_NATS_PASSWORD", PASSWORD)
        nc = await connect(url, "own-service")
        assert nc.is_connected
        await nc.close()
    finally:
        proc.stop()


async def test_the_faststream_broker_of_the_tools_service_authenticates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools service's request/reply handlers sit on a faststream broker, which takes the
    user and password as a security object (as connect options it refused to start)."""
    proc, url = start_nats(credentials=("chorus", PASSWORD))
    try:
        monkeypatch.setenv("CHORUS_NATS_USER", "chorus")
        monkeypatch.setenv("CHORUS_NATS_PASSWORD", PASSWORD)
        broker = make_broker(BusSettings(nats_url=url), "tools")
        await asyncio.wait_for(broker.start(), 10)
        try:
            assert broker.connection.is_connected
        finally:
            await broker.stop()
    finally:
        proc.stop()
