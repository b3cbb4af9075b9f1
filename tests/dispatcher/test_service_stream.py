"""The dispatcher service over real NATS, in front of the simulated engine (in this process):
generations stream as token batches, in every engine protocol, and an interrupted output
resumes where it stopped."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.harmony import CALL
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.bus import generate_request
from tests.dispatcher.stack import ENC, TOOL_PROMPT, check_stream, dispatcher, ids, new_id


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both")) as running_sim:
        yield running_sim


@pytest.fixture(scope="module")
async def sim_incremental() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="sglang", sglang_incremental=True, tokens_per_chunk=4)) as running_sim:
        yield running_sim


@pytest.fixture(scope="module")
async def sim_prefill() -> AsyncIterator[RunningSim]:
    """First tokens 100 ms after the engine answered: the opening batch goes out alone."""
    async with serving(SimSettings(protocol="both", prefill_delay_ms=100)) as running_sim:
        yield running_sim


@pytest.mark.parametrize("kind", ["sim", "vllm", "sglang", "sglang-incremental"])
async def test_generate_streams_token_batches(
    nats_url: str, namespace: str, sim: RunningSim, sim_incremental: RunningSim, kind: str
) -> None:
    engine = sim_incremental if kind == "sglang-incremental" else sim
    expected = plan(TOOL_PROMPT, ENC).output_ids
    g = new_id(kind)
    async with dispatcher(nats_url, namespace, [f"{kind.split('-')[0]}={engine.url}"]) as d:
        await d.send(generate_request(g, TOOL_PROMPT))
        accepted = await d.accepted(g)
        batches = await d.stream(g)
    assert accepted.dispatcher == d.settings.instance_id
    assert (accepted.worker, accepted.engine) == (engine.url, kind.split("-")[0])
    assert accepted.prompt_tokens == len(TOOL_PROMPT)
    check_stream(batches, g)
    assert ids(batches) == expected and expected[-1] == CALL
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id, last.error) == ("stop", CALL, None)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(TOOL_PROMPT), len(expected))
    if kind == "sglang-incremental":  # deltas of 4 tokens, as the engine sent them
        assert all(len(b.token_ids) % 4 == 0 for b in batches[:-1])


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_resume_continues_an_interrupted_output(
    nats_url: str, namespace: str, sim_prefill: RunningSim, kind: str
) -> None:
    """The tokens an earlier attempt produced open the stream; the engine is given them after
    the prompt, continues from there, and usage counts the whole output."""
    expected = plan(TOOL_PROMPT, ENC).output_ids
    k = 5
    assert len(expected) > k + 3
    g, short = new_id("resume"), new_id("resume-short")
    async with dispatcher(nats_url, namespace, [f"{kind}={sim_prefill.url}"]) as d:
        await d.send(generate_request(g, TOOL_PROMPT, resume_tokens=expected[:k]))
        assert (await d.accepted(g)).prompt_tokens == len(TOOL_PROMPT)
        batches = await d.stream(g)
        record = await sim_prefill.recorder.wait_for(g)
        # the output budget counts the resumed tokens
        await d.send(generate_request(short, TOOL_PROMPT, resume_tokens=expected[:k], max_tokens=k + 3))
        clipped = await d.stream(short)
    assert record.prompt_token_ids == [*TOOL_PROMPT, *expected[:k]]
    check_stream(batches, g)
    assert (batches[0].offset, batches[0].token_ids) == (0, expected[:k])
    assert batches[1].offset == k
    assert ids(batches[1:]) == expected[k:]
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id, last.error) == ("stop", CALL, None)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(TOOL_PROMPT), len(expected))
    check_stream(clipped, short)
    assert ids(clipped) == expected[: k + 3] and clipped[-1].finish_reason == "length"
    assert clipped[-1].usage is not None
    assert (clipped[-1].usage.prompt_tokens, clipped[-1].usage.completion_tokens) == (len(TOOL_PROMPT), k + 3)
