"""Services authenticate to a NATS server that requires it (the compose stack's) with
CHORUS_NATS_USER / CHORUS_NATS_PASSWORD, read by the settings and passed as options (a password
with spaces works); every service, the tools service included, on the one client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from services.common.bus import connect
from services.common.infra import ManagedProcess, start_nats
from services.common.settings import BusSettings

PASSWORD = "s3cret word 'x' }"


@pytest.fixture
def auth_nats() -> Iterator[str]:
    proc, url = start_nats(credentials=("chorus", PASSWORD))
    try:
        yield url
    finally:
        proc.stop()


def options(monkeypatch: pytest.MonkeyPatch, user: str | None) -> dict[str, object]:
    """The options a service's settings give for this environment."""
    if user is None:
        monkeypatch.delenv("CHORUS_NATS_USER", raising=False)
        monkeypatch.delenv("CHORUS_NATS_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("CHORUS_NATS_USER", user)
        monkeypatch.setenv("CHORUS_NATS_PASSWORD", PASSWORD)
    return BusSettings().nats_options()


async def test_services_connect_with_credentials_and_not_without(
    auth_nats: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = await connect(auth_nats, "auth-test", options(monkeypatch, "chorus"))
    assert nc.is_connected
    await nc.close()
    with pytest.raises(Exception, match="Authorization Violation"):
        await asyncio.wait_for(connect(auth_nats, "no-auth-test", options(monkeypatch, None)), 10)


async def test_the_nats_of_chorus_up_admits_only_its_own_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """``chorus up`` starts its own NATS (none answered) with a password made for the run and
    hands it to its services: a client without it is refused."""
    proc: ManagedProcess
    proc, url = start_nats(credentials=("chorus", PASSWORD))
    try:
        assert PASSWORD not in " ".join(proc.args)  # argv is readable by every local user
        with pytest.raises(Exception, match="Authorization Violation"):
            await asyncio.wait_for(connect(url, "stranger", options(monkeypatch, None)), 10)
        nc = await connect(url, "own-service", options(monkeypatch, "chorus"))
        assert nc.is_connected
        await nc.close()
    finally:
        proc.stop()
