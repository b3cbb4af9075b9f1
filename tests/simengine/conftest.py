"""The simulator in this event loop, both protocols (a module's own ``sim`` or ``http``
overrides these)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.simengine.app import RunningSim, serving
from services.simengine.settings import Settings


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(Settings(protocol="both")) as running:
        yield running


@pytest.fixture
async def http(sim: RunningSim) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        yield client
