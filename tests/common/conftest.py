"""Fixtures of the ``Wire`` tests (test_wire*.py): a fresh subject, ``Wire`` connections to the
tests' NATS (closed at the end), and a nats-py client for interop."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from services.common.wire import Wire
from tests.common.wire_support import Connect


@pytest.fixture
def subject() -> str:
    return f"wiretest.{uuid.uuid4().hex}"


@pytest.fixture
async def connect(nats_url: str) -> AsyncIterator[Connect]:
    opened: list[Wire] = []

    async def open_wire(url: str | None = None, **options: Any) -> Wire:
        wire = await Wire.connect(url or nats_url, **options)
        opened.append(wire)
        return wire

    yield open_wire
    for wire in opened:
        await wire.close()


@pytest.fixture
async def wire(connect: Connect) -> Wire:
    return await connect(name="wire-test")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()
