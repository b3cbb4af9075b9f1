"""The request path under size and load: prompts up to the model's context, many streams at
once, and a caller who gives up (the engine is told)."""

from __future__ import annotations

import asyncio

import httpx

from tests.e2e.conftest import MODEL, RunningStack


def test_a_prompt_near_the_context_length(stack: RunningStack) -> None:
    """About 120,000 prompt tokens (over NATS's 1 MB message limit as token ids): answered."""
    text = "word " * 120_000
    resp = stack.client(timeout=120).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=64
    )
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens > 120_000
    record = stack.wait_engine(lambda r: r["request_id"] == resp.id)
    assert record["prompt_tokens"] == resp.usage.prompt_tokens


def test_a_prompt_over_the_context_length_is_a_400(stack: RunningStack) -> None:
    text = "word " * 140_000
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        resp = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": text}]})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_truncation_auto_leaves_out_the_oldest_messages(stack: RunningStack) -> None:
    """A conversation of about 150,000 tokens: refused as it is, answered with
    ``truncation: "auto"`` from its most recent messages that fit with the output's room."""
    history = [
        {"role": "user", "content": "first " * 50_000},
        {"role": "assistant", "content": "second " * 50_000},
        {"role": "user", "content": "third " * 50_000},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and now? [[sim:tokens=8]]"},
    ]
    body = {"model": MODEL, "input": history, "max_output_tokens": 1000}
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        refused = http.post("/v1/responses", json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        resp = http.post("/v1/responses", json={**body, "truncation": "auto"})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["status"] == "completed" and answer["truncation"] == "auto"
    record = stack.wait_engine(lambda r: r["request_id"] == answer["id"])
    # the first two messages left; the third (50,000 words) and the rest fit with 1000 to spare
    assert 50_000 < record["prompt_tokens"] <= 131_072 - 1000
    assert answer["usage"]["input_tokens"] == record["prompt_tokens"]


def test_two_hundred_streams_at_once(stack: RunningStack) -> None:
    """200 concurrent streams of 200 tokens: every one completes (no 504 while the engine
    and the services are busy)."""

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": MODEL,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Load {i} [[sim:tokens=200]]"}],
        }
        usage = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for line in resp.aiter_lines():
                assert '"error"' not in line, line
                if '"usage"' in line and '"choices":[]' in line:
                    usage = httpx.Response(200, content=line[6:]).json()["usage"]["completion_tokens"]
        return usage

    async def run() -> list[int]:
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=120, limits=limits) as client:
            return list(await asyncio.gather(*(one(client, i) for i in range(200))))

    usages = asyncio.run(run())
    assert all(u > 200 for u in usages), usages
