"""The tools tests' fixture: a tools service with the default settings (see service_client.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.tools.service_client import Tools, tools_service


@pytest.fixture
async def tools(nats_url: str, namespace: str) -> AsyncIterator[Tools]:
    async with tools_service(nats_url, namespace) as client:
        yield client
