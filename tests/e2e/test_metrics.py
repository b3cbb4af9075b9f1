"""The gateway's /metrics tells the truth for the whole stack: after real requests through
`chorus up`, each family counts what happened, with samples from every service."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai.types.responses.tool_param import Mcp

from tests.e2e.conftest import MODEL, RunningStack, Stacks, total
from tests.mcp_servers import serve_mcp


@pytest.fixture(scope="module")
def metrics_stack(stacks: Stacks) -> Iterator[RunningStack]:
    yield stacks.get("mcp")  # a stack with MCP egress to loopback allowed


async def test_requests_tokens_and_latencies_for_both_apis(metrics_stack: RunningStack) -> None:
    before = metrics_stack.metrics()
    client = metrics_stack.async_client()
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "metrics chat"}])
    stream = await client.chat.completions.create(
        model=MODEL, stream=True, messages=[{"role": "user", "content": "metrics stream"}]
    )
    async for _ in stream:
        pass
    await client.responses.create(model=MODEL, input="metrics responses")
    after = metrics_stack.metrics()

    def grew(name: str, by: float = 1, **labels: str) -> None:
        assert total(after, name, **labels) - total(before, name, **labels) >= by, (name, labels)

    for api, n in (("chat", 2), ("responses", 1)):
        grew("chorus_requests_total", n, api=api, model=MODEL)
        grew("chorus_time_to_first_token_seconds_count", n, api=api, model=MODEL)
        grew("chorus_request_duration_seconds_count", n, api=api, model=MODEL)
        grew("chorus_inter_token_latency_seconds_count", n, api=api, model=MODEL)
        grew("chorus_prompt_tokens_total", 10 * n, api=api, model=MODEL)
        grew("chorus_output_tokens_total", 2 * n, api=api, model=MODEL)
    grew("chorus_bus_hop_seconds_count", 3, hop="accepted")
    grew("chorus_bus_hop_seconds_count", 3, hop="first_batch")
    assert total(after, "chorus_requests_in_flight", api="chat") == 0
    # the dispatcher's view of its engine: up, and nothing streaming once the answers are in
    # (one dispatcher per worker process, each with its own view of the same engine; a
    # dispatcher that has streamed nothing yet has no in-flight sample: the router may have
    # sent every request to the same worker)
    assert [v for labels, v in after["chorus_engine_up"] if labels["kind"] == "sim"] == [1, 1]
    in_flight = [v for _, v in after["chorus_engine_in_flight"]]
    assert in_flight and set(in_flight) == {0}
    # every process of the stack answered the scrape with its own registry, once (a worker
    # beats as three roles and answers as the worker)
    services = {labels.get("service") for samples in after.values() for labels, _ in samples}
    assert services == {"gateway", "worker", "tools"}, services
    workers = {labels["instance"] for labels, _ in after["chorus_engine_up"]}
    assert len(workers) == 2, workers


async def test_tool_calls_are_counted_by_outcome(metrics_stack: RunningStack) -> None:
    before = metrics_stack.metrics()
    client = metrics_stack.async_client()
    async with serve_mcp() as server:
        tool: Mcp = {"type": "mcp", "server_label": "t", "require_approval": "never", "server_url": server.url}
        ok = await client.responses.create(model=MODEL, input="Please add two numbers with add", tools=[tool])
        boom = await client.responses.create(model=MODEL, input="call boom now", tools=[tool])
    assert ok.status == boom.status == "completed"
    after = metrics_stack.metrics()
    for outcome in ("ok", "error"):
        grown = total(after, "chorus_tool_calls_total", server="mcp", outcome=outcome) - total(
            before, "chorus_tool_calls_total", server="mcp", outcome=outcome
        )
        assert grown == 1, (outcome, grown)
