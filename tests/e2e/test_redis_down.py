"""Redis stopped under a running stack: what needs storage is a clear 503 before any engine
work, what does not keeps working, and once Redis is back (its append-only file kept) stored
responses are there and storing works again."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.common.infra import ManagedProcess, free_port, start_redis
from tests.e2e.conftest import MODEL, RunningStack, start_stack
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def redis_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("redis-data")


@pytest.fixture(scope="module")
def own_redis(redis_dir: Path) -> Iterator[tuple[list[ManagedProcess], int]]:
    port = free_port()
    proc, _ = start_redis(port, data_dir=redis_dir)
    procs = [proc]
    yield procs, port
    for p in procs:
        p.stop()


@pytest.fixture(scope="module")
def redis_stack(nats_url: str, own_redis: tuple[list[ManagedProcess], int]) -> Iterator[RunningStack]:
    _, port = own_redis
    stack = start_stack("redis-down", nats_url, f"redis://127.0.0.1:{port}/0")
    yield stack
    stack.stop()


def flush(port: int) -> None:
    """Everything written so far is on disk (the append-only file is rewritten and synced)."""
    r = redis.Redis(port=port)
    r.bgrewriteaof()

    def rewritten() -> bool:
        persistence = r.info("persistence")
        return not (persistence["aof_rewrite_in_progress"] or persistence["aof_rewrite_scheduled"])

    wait_until(rewritten, 30, "the append-only file rewritten")
    r.close()


def test_storage_down_then_back(
    redis_stack: RunningStack, own_redis: tuple[list[ManagedProcess], int], redis_dir: Path
) -> None:
    procs, port = own_redis
    http = httpx.Client(base_url=redis_stack.base_url, timeout=30)
    kept = http.post("/v1/responses", json={"model": MODEL, "input": "remember me"})
    assert kept.status_code == 200, kept.text
    flush(port)
    procs[0].stop()

    marker = f"needs-storage-{uuid.uuid4().hex[:8]}"
    for body in (
        {"model": MODEL, "input": marker},
        {"model": MODEL, "input": marker, "stream": True},
        {"model": MODEL, "input": marker, "background": True},
        {"model": MODEL, "input": "go on", "previous_response_id": kept.json()["id"], "store": False},
    ):
        resp = http.post("/v1/responses", json=body)
        assert resp.status_code == 503, (body, resp.status_code, resp.text)
        assert resp.json()["error"]["code"] == "storage_unavailable"
    assert not [r for r in redis_stack.engine_requests() if marker in r.get("prompt_text", "")], (
        "the engine worked for a response that could not be stored"
    )
    # what needs no storage still works
    chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text
    unstored = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "store": False})
    assert unstored.status_code == 200 and unstored.json()["status"] == "completed"
    assert http.get("/health").status_code == 503

    proc, _ = start_redis(port, data_dir=redis_dir)  # back, with its data
    procs.append(proc)
    wait_until(
        lambda: http.post("/v1/responses", json={"model": MODEL, "input": "again"}).status_code == 200,
        20,
        "storing working again after Redis came back",
        every=0.5,
    )
    assert http.get(f"/v1/responses/{kept.json()['id']}").json()["output"] == kept.json()["output"]
    http.close()


def test_storage_lost_mid_stream_ends_with_response_failed(
    redis_stack: RunningStack, own_redis: tuple[list[ManagedProcess], int], redis_dir: Path
) -> None:
    """Redis stops while a stored response streams: the stream still ends with a typed,
    numbered terminal event (``response.failed``: the spec's ``server_error`` code, the message
    naming ``storage_unavailable``), never an untyped internal error."""
    procs, port = own_redis
    body = {"model": MODEL, "input": "slowly [[sim:tokens=60]] [[sim:delay_ms=40]]", "stream": True}
    events: list[dict[str, object]] = []
    with (
        httpx.Client(base_url=redis_stack.base_url, timeout=60) as http,
        http.stream("POST", "/v1/responses", json=body) as resp,
    ):
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 6:
                    procs[-1].stop()  # Redis goes away mid-answer
    try:
        assert all("type" in e and "sequence_number" in e for e in events), events[-3:]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        last = events[-1]
        assert last["type"] == "response.failed", last
        error = last["response"]["error"]  # type: ignore[index]
        assert error["code"] == "server_error" and "storage_unavailable" in error["message"], last
    finally:
        proc, _ = start_redis(port, data_dir=redis_dir)
        procs.append(proc)
