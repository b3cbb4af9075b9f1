"""Fleet routing end to end: `chorus up` (two workers) in front of three simulated engines with
prefix caches, with their KV cache events and without (the stack's own record of what it sent):
a conversation's later turns go to the engine that holds its history (and the engine reports
those prompt tokens as cached), first turns arriving together spread over the engines."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from services.common.infra import ManagedProcess, free_port
from tests.e2e.conftest import MODEL, RunningStack, start_sim_engine, start_stack
from tests.waiting import wait_until

DOCUMENT = " ".join(f"fact{i} is about item {i * 7 % 101}." for i in range(400))  # ~3k tokens


@dataclass
class Fleet:
    stack: RunningStack
    engines: list[str]  # their URLs

    def served_by(self, request_id: str) -> str:
        """The engine that served the (last) generation of ``request_id``."""
        for url in self.engines:
            records = httpx.get(f"{url}/sim/requests", timeout=5).json()
            if any(request_id in (r.get("request_id") or "") for r in records):
                return url
        raise AssertionError(f"no engine served {request_id}")


def fleet(name: str, nats_url: str, redis_url: str, *, events: bool) -> Iterator[Fleet]:
    procs: list[ManagedProcess] = []
    specs, urls = [], []
    for _ in range(3):
        env = {"CHORUS_SIM_KV_CACHE_TOKENS": "200000"}
        extra = ""
        if events:
            pub, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            env |= {"CHORUS_SIM_KV_EVENTS_ENDPOINT": pub, "CHORUS_SIM_KV_EVENTS_REPLAY_ENDPOINT": replay}
            extra = f",kv_events={pub},kv_replay={replay}"
        proc, url = start_sim_engine("vllm", env=env)
        procs.append(proc)
        urls.append(url)
        specs.append(f"vllm={url}{extra}")
    stack = start_stack(name, nats_url, redis_url, engines=specs, extra_args=["--routing", "cache_aware"])
    try:
        yield Fleet(stack, urls)
    finally:
        stack.stop()
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module", params=["events", "no-events"])
def routed(request: pytest.FixtureRequest, nats_url: str, redis_url: str) -> Iterator[Fleet]:
    yield from fleet(f"routing-{request.param}", nats_url, redis_url, events=request.param == "events")


async def turn(client: openai.AsyncOpenAI, history: list[dict[str, str]], question: str) -> tuple[str, int]:
    history.append({"role": "user", "content": f"{question} [[sim:tokens=8]]"})
    answer = await client.chat.completions.create(model=MODEL, messages=history)  # type: ignore[arg-type]
    history.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    details = answer.usage.prompt_tokens_details if answer.usage else None
    return answer.id, (details.cached_tokens or 0) if details else 0


def test_a_conversation_stays_on_the_engine_that_holds_it(routed: Fleet) -> None:
    client = routed.stack.async_client()
    histories = [
        [{"role": "system", "content": f"You are assistant {c}."}, {"role": "user", "content": f"{c}: {DOCUMENT}"}]
        for c in range(6)
    ]

    async def run() -> list[list[tuple[str, int]]]:
        firsts = await asyncio.gather(*(turn(client, h, "Summarise it.") for h in histories))  # together
        later = [[first] for first in firsts]
        for t in range(2):
            for c, h in enumerate(histories):
                later[c].append(await turn(client, h, f"Question {t} about it?"))
        return later

    turns = asyncio.run(run())
    homes = [routed.served_by(conversation[0][0]) for conversation in turns]
    assert len(set(homes)) >= 2, homes  # the first turns arrived together: spread by load
    for home, conversation in zip(homes, turns, strict=True):
        for request_id, cached in conversation[1:]:
            assert routed.served_by(request_id) == home, (home, conversation)
            assert cached > 2000, conversation  # the engine found the history in its cache

    # the decisions by reason (a scrape may miss a slow worker's answer: taken until whole). The
    # twelve later turns went home (above); a few may be "load" rather than "cache": the engine
    # that served the turn just before may still count its decode, and then the home engine wins
    # even without its cache. The first turns are never "cache" (nothing cached yet).
    def by_reason() -> tuple[float, float]:
        metric = routed.stack.metric
        return metric("chorus_routing_decisions_total", reason="cache"), metric(
            "chorus_routing_decisions_total", reason="load"
        )

    def settled() -> bool:
        cache, load = by_reason()
        return cache + load >= 18 and cache >= 10

    wait_until(
        settled, 10, lambda: f"18 decisions, 10 or more of the later turns' by cache, not {by_reason()}", every=0.2
    )
