"""Shared fixtures: real NATS (JetStream) and Redis, started from the Python packages when
nothing answers at NATS_URL / REDIS_URL (CI and developer machines usually have both)."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
import redis
from openai_harmony import HarmonyEncoding

from services.common.harmony import harmony_encoding
from services.common.infra import ManagedProcess, ensure_nats, ensure_redis
from tests import leftovers


class _Servers:
    """The session's NATS and Redis, started (when nothing answers) and cleaned once per test
    run: by the one process when the tests run in one, by the controller when pytest-xdist runs
    them in several (its workers inherit the URLs through the environment, so they neither
    start servers of their own nor remove what another worker's tests still use)."""

    procs: list[ManagedProcess] = []
    streams: set[str] = set()
    namespaces: set[str] = set()

    @classmethod
    def start(cls) -> None:
        nats_proc, nats = ensure_nats(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
        redis_proc, redis_at = ensure_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
        cls.procs = [p for p in (nats_proc, redis_proc) if p is not None]
        os.environ["NATS_URL"], os.environ["REDIS_URL"] = nats, redis_at
        cls.streams = asyncio.run(leftovers.stream_names(nats))
        with redis.Redis.from_url(redis_at) as client:
            cls.namespaces = leftovers.namespaces(client)

    @classmethod
    def stop(cls) -> None:
        """Remove the streams and keys of the namespaces the tests made, then stop the servers
        started here."""
        try:
            asyncio.run(leftovers.remove_test_streams(os.environ["NATS_URL"], cls.streams))
            with redis.Redis.from_url(os.environ["REDIS_URL"]) as client:
                leftovers.remove_test_keys(client, cls.namespaces)
        finally:
            for proc in cls.procs:
                proc.stop()


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _xdist_worker(session.config):
        _Servers.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _xdist_worker(session.config):
        _Servers.stop()


@pytest.fixture(scope="session")
def nats_url() -> str:
    return os.environ["NATS_URL"]


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The tests' Redis; the keys they wrote under their own namespaces are removed at the end."""
    return os.environ["REDIS_URL"]


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
