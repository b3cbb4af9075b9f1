"""Shared fixtures: real NATS (JetStream) and Redis, started from the Python packages when
nothing answers at NATS_URL / REDIS_URL (CI and developer machines usually have both)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from openai_harmony import HarmonyEncoding

from services.common.harmony import harmony_encoding
from services.common.infra import ensure_nats, ensure_redis
from tests import leftovers


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    proc, url = ensure_nats(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    existing = asyncio.run(leftovers.stream_names(url))
    yield url
    asyncio.run(leftovers.remove_test_streams(url, existing))
    if proc:
        proc.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The tests' Redis; the keys they wrote under their own namespaces are removed at the end."""
    proc, url = ensure_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    client = redis.Redis.from_url(url)
    existing = leftovers.namespaces(client)
    yield url
    leftovers.remove_test_keys(client, existing)
    client.close()
    if proc:
        proc.stop()


@pytest.fixture(scope="session", autouse=True)
def _log_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    leftovers.LOGS.root = str(tmp_path_factory.mktemp("stacks"))


@pytest.fixture
def namespace() -> str:
    """A namespace of its own for each test, so tests sharing one NATS/Redis never collide."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def encoding() -> HarmonyEncoding:
    return harmony_encoding()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Whole-stack tests run last: their stacks (dozens of processes) live until the session
    ends, and unit and service tests should not share the machine with them."""
    items.sort(key=lambda item: "/e2e/" in str(item.path))
