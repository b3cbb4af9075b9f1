"""Process deaths under load: `chorus up` over real NATS and Redis (its workers, and the roles
as processes of their own with --split), 8 streams in flight, one process killed with SIGKILL. Every stream must end with exactly the text an undisturbed run
gives, and no stream may pause more than 5 seconds longer than the undisturbed run's longest
pause (a death is noticed in about a second; the rest is allowance for a loaded machine).

The simulated engine is deterministic (a resumed output continues the same script), so an
undisturbed run of the same prompts is the reference."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from functools import partial

import httpx
import openai
import pytest

from contracts.messages.items import MessageItem
from contracts.messages.parse import Finished, ItemAdded, ItemDelta, ItemDone, Usage
from services.common.infra import ManagedProcess, free_port
from services.gateway.responses.background import Job, LoggedStep
from services.gateway.store import RedisResponseStore
from tests.e2e.conftest import MODEL, RunningStack, samples_of, start_sim_engine, start_stack, total
from tests.e2e.streams import Streamed, kill, run_streams
from tests.waiting import wait_until

MAX_PAUSE_S = 5.0


@pytest.fixture(scope="module")
def engines() -> Iterator[list[tuple[ManagedProcess, str]]]:
    started = [start_sim_engine("vllm"), start_sim_engine("vllm")]
    yield started
    for proc, _ in started:
        proc.stop()


@pytest.fixture(scope="module")
def fault_stack(nats_url: str, redis_url: str, engines: list[tuple[ManagedProcess, str]]) -> Iterator[RunningStack]:
    stack = start_stack("faults", nats_url, redis_url, engines=[f"sim={url}" for _, url in engines])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def reference(fault_stack: RunningStack) -> dict[str, list[Streamed]]:
    """The undisturbed run of the same prompts, per API."""
    return {api: asyncio.run(run_streams(fault_stack, api)) for api in ("chat", "responses")}


@pytest.fixture(scope="module")
def split_stack(nats_url: str, redis_url: str, engines: list[tuple[ManagedProcess, str]]) -> Iterator[RunningStack]:
    """`chorus up --split`: an encoder, a dispatcher and two parsers, each a process."""
    stack = start_stack("faults-split", nats_url, redis_url, engines=[f"sim={engines[0][1]}"], extra_args=["--split"])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def split_reference(split_stack: RunningStack) -> dict[str, list[Streamed]]:
    return {api: asyncio.run(run_streams(split_stack, api)) for api in ("chat", "responses")}


def check(got: list[Streamed], want: list[Streamed]) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.error is None, f"stream {i} failed: {g.error}"
        assert w.content and w.reasoning
        assert g.content == w.content, f"stream {i}: the answer differs from the undisturbed run"
        assert g.reasoning == w.reasoning, f"stream {i}: the reasoning differs from the undisturbed run"
        # the allowance sits on top of the undisturbed run's own longest pause (a loaded machine)
        assert g.longest_pause < MAX_PAUSE_S + w.longest_pause, f"stream {i} paused {g.longest_pause:.2f}s"


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_kill_one_worker_of_two(fault_stack: RunningStack, reference: dict[str, list[Streamed]], api: str) -> None:
    """A worker (encoder, dispatcher and parser) dies: the streams it held continue on the
    other one from their tokens, and `chorus up` starts a new worker."""
    workers = fault_stack.wait_children("serve worker", 2)
    fault_stack.wait_healthy()
    resumed = fault_stack.metric("chorus_generation_resumes_total")
    got = asyncio.run(run_streams(fault_stack, api, lambda: kill(workers[0])))
    check(got, reference[api])
    assert "resuming" in fault_stack.log("gateway")  # some streams were on the dead worker
    assert fault_stack.metric("chorus_generation_resumes_total") > resumed
    fault_stack.wait_healthy()
    assert workers[0] not in fault_stack.children("serve worker")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_kill_one_parser_of_two(
    split_stack: RunningStack, split_reference: dict[str, list[Streamed]], api: str
) -> None:
    parsers = split_stack.wait_children("serve parser", 2)
    split_stack.wait_healthy()
    resumed = split_stack.metric("chorus_generation_resumes_total", reason="parser")
    got = asyncio.run(run_streams(split_stack, api, lambda: kill(parsers[0])))
    check(got, split_reference[api])
    assert "resuming" in split_stack.log("gateway")  # some streams were on the dead parser
    assert split_stack.metric("chorus_generation_resumes_total", reason="parser") > resumed


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_kill_the_dispatcher(split_stack: RunningStack, split_reference: dict[str, list[Streamed]], api: str) -> None:
    [dispatcher] = split_stack.wait_children("serve dispatcher", 1)
    split_stack.wait_healthy()
    got = asyncio.run(run_streams(split_stack, api, lambda: kill(dispatcher)))
    check(got, split_reference[api])
    split_stack.wait_healthy()
    assert split_stack.children("serve dispatcher") != [dispatcher]  # chorus up started a new one


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_kill_one_engine_of_two(
    fault_stack: RunningStack, reference: dict[str, list[Streamed]], engines: list[tuple[ManagedProcess, str]], api: str
) -> None:
    """The engine streaming the most of eight generations is killed: they go on on the other
    one from their tokens (routing may well have put all eight on one engine: the one that
    holds their prompts)."""
    fault_stack.wait_healthy()
    # both workers' dispatchers take both engines for up (one was started again after the
    # test before: until a health poll says so, every stream goes to the other one)
    for _, url in engines:
        wait_until(partial(engine_up_in_both, fault_stack, url), 30, f"{url} up")
    resumed = fault_stack.metric("chorus_generation_resumes_total")
    killed: list[int] = []

    def kill_the_busier() -> None:
        running = [engine_running(url) for _, url in engines]
        i = max(range(len(engines)), key=running.__getitem__)
        assert running[i] > 0, running
        proc = engines[i][0].proc
        assert proc is not None
        killed.append(i)
        kill(proc.pid)

    got = asyncio.run(run_streams(fault_stack, api, kill_the_busier))
    check(got, reference[api])
    assert fault_stack.metric("chorus_generation_resumes_total") > resumed  # they went on elsewhere
    i = killed[0]  # back for the next test
    engines[i] = start_sim_engine("vllm", port=int(engines[i][1].rsplit(":", 1)[1]))


def engine_up_in_both(stack: RunningStack, url: str) -> bool:
    return stack.metric("chorus_engine_up", engine=url) >= 2


def engine_running(url: str) -> float:
    """The requests a simulated engine is streaming, from its own /metrics (vLLM's gauge)."""
    return total(samples_of(httpx.get(f"{url}/metrics", timeout=5).text), "vllm:num_requests_running")


def test_sigterm_drains_a_worker(fault_stack: RunningStack, reference: dict[str, list[Streamed]]) -> None:
    """A worker asked to stop finishes the streams and sessions it holds: no stream is resumed."""
    workers = fault_stack.wait_children("serve worker", 2)
    fault_stack.wait_healthy()
    before = sum("resuming" in line for line in fault_stack.log("gateway").splitlines())
    got = asyncio.run(run_streams(fault_stack, "chat", lambda: os.kill(workers[0], signal.SIGTERM)))
    check(got, reference["chat"])
    resumed = [line for line in fault_stack.log("gateway").splitlines() if "resuming" in line][before:]
    assert not resumed, resumed
    logs = fault_stack.log("worker-1") + fault_stack.log("worker-2")
    for role in ("encoder", "dispatcher", "parser"):
        assert re.search(rf"{role} \w+: draining", logs), role


def test_nats_restart(nats_url: str, redis_url: str) -> None:
    """The stack's own NATS server dies and `chorus up` starts it again: every stream in
    flight resumes (or ends with a clear error) within seconds."""
    own_nats = f"nats://127.0.0.1:{free_port()}"  # nothing listens there: chorus up starts it
    stack = start_stack("nats-restart", own_nats, redis_url)
    try:
        want = asyncio.run(run_streams(stack, "chat"))
        [server] = stack.children("nats-server")
        started = time.monotonic()
        got = asyncio.run(run_streams(stack, "chat", lambda: kill(server)))
        assert time.monotonic() - started < 20
        for g, w in zip(got, want, strict=True):
            assert g.error is None and g.content == w.content and g.reasoning == w.reasoning
            assert g.longest_pause < 5.0
    finally:
        stack.stop()


def test_background_response_survives_its_gateway(fault_stack: RunningStack) -> None:
    """A background response whose gateway is killed completes on another replica; a client
    following its stream sees one stream: every sequence number once, the same text."""
    fault_stack.wait_healthy()
    prompt = "Background fault [[sim:tokens=400]] [[sim:delay_ms=8]]"
    client = fault_stack.client()
    want = client.responses.create(model=MODEL, input=prompt)  # the undisturbed answer
    other, url = fault_stack.start_gateway()
    try:
        b = openai.OpenAI(base_url=url, api_key="chorus", max_retries=0, timeout=60)
        resp = client.responses.create(model=MODEL, input=prompt, background=True)
        stream = b.responses.retrieve(resp.id, stream=True)
        events = []
        for event in stream:
            events.append(event)
            if len(events) == 40:  # under way: the gateway that runs it dies
                [gateway] = fault_stack.children("serve gateway")
                kill(gateway)
            if event.type in ("response.completed", "response.failed", "response.incomplete"):
                break
        seqs = [e.sequence_number for e in events]
        assert seqs == list(range(len(seqs))), "a follower saw gaps or repeats"
        assert events[-1].type == "response.completed", events[-1]
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == want.output_text
        final = b.responses.retrieve(resp.id)
        assert final.status == "completed" and final.output_text == want.output_text
    finally:
        other.stop()


def test_takeover_sends_a_logged_batch_whose_events_were_never_appended(fault_stack: RunningStack) -> None:
    """The owner logged a batch (its parse events) and died before appending the batch's
    events to the stream: the replica that takes the run over sends them."""
    fault_stack.wait_healthy()
    rid = f"resp_{os.urandom(12).hex()}"
    request = {"model": MODEL, "input": "orphan", "background": True, "store": True}
    job = Job(response_id=rid, created_at=int(time.time()), request=request, input_ids=[])
    message = MessageItem(role="assistant", content="Hello world", id=f"msg_{rid}", channel="final")
    step = LoggedStep(
        turn=0,
        tokens=[1, 2, 3],
        parsed=[
            ItemAdded(output_index=0, item=message.model_copy(update={"content": "", "status": "in_progress"})),
            ItemDelta(output_index=0, delta="Hello "),
            ItemDelta(output_index=0, delta="world"),
            ItemDone(output_index=0, item=message),
            Finished(finish_reason="stop", usage=Usage(prompt_tokens=5, completion_tokens=3)),
        ],
    )

    async def orphan() -> None:  # the job as its dead owner left it: logged, no lease, no events
        store = RedisResponseStore.from_url(fault_stack.redis_url, namespace=fault_stack.namespace, ttl_s=600)
        try:
            await store.put_job(rid, job.model_dump_json().encode(), [])
            await store.add_step(rid, step.model_dump_json().encode())
        finally:
            await store.close()

    asyncio.run(orphan())
    client = fault_stack.client()
    deadline = time.monotonic() + 30
    while True:  # the sweep (every second) takes it over and stores the response
        try:
            client.responses.retrieve(rid)
            break
        except openai.NotFoundError:
            assert time.monotonic() < deadline, "no replica took the orphaned run over"
            time.sleep(0.2)
    events = list(client.responses.retrieve(rid, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello world"
    assert client.responses.retrieve(rid).output_text == "Hello world"
