"""Services authenticate to a NATS server that requires it (the compose stack's) with
CHORUS_NATS_USER / CHORUS_NATS_PASSWORD, passed as options (a password with spaces works)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from services.common.bus import connect
from services.common.infra import free_port

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
