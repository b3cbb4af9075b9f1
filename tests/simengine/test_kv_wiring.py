"""The simulator as an engine with a prefix cache: prefill costs time per uncached token, one
prefill at a time, and its KV cache events reach a subscriber as vLLM's would."""

from __future__ import annotations

import asyncio
import time

import httpx

from services.common.kv_events import BlockStored, EventBatch
from services.dispatcher.kv_subscriber import KvSubscriber
from services.simengine.app import serving
from services.simengine.settings import Settings
from tests.simengine.wire import vllm_body

PROMPT = [200006, 17360, 200008, *range(1000, 1000 + 320), 200007, 200006, 173781]


async def test_events_reach_a_subscriber_and_the_cache_is_reported() -> None:
    settings = Settings(kv_events_endpoint="tcp://127.0.0.1:0", kv_events_replay_endpoint="tcp://127.0.0.1:0")
    async with serving(settings) as sim:
        assert sim.kv_events is not None and sim.kv_replay is not None
        stored: asyncio.Queue[BlockStored] = asyncio.Queue()

        def on_batch(seq: int, batch: EventBatch) -> None:
            for event in batch.events:
                if isinstance(event, BlockStored):
                    stored.put_nowait(event)

        subscriber = KvSubscriber(sim.kv_events, sim.kv_replay, on_batch, lambda _: None, silence_s=30)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg, httpx.AsyncClient(base_url=sim.url, timeout=10) as http:
            tg.create_task(subscriber.run(stop))
            first = (await http.post("/v1/completions", json=vllm_body(PROMPT, "kv-1", stream=False))).json()
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            event = await asyncio.wait_for(stored.get(), 10)  # caught up by replay if it came first
            assert event.parent_block_hash is None and list(event.token_ids) == PROMPT[: 16 * len(event.block_hashes)]
            again = (await http.post("/v1/completions", json=vllm_body(PROMPT, "kv-2", stream=False))).json()
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 16 * (len(PROMPT) // 16)
            stop.set()


async def test_prefill_costs_time_per_uncached_token_one_at_a_time() -> None:
    async with (
        serving(Settings(prefill_us_per_token=1000)) as sim,  # 1 ms a token: 327 ms for PROMPT
        httpx.AsyncClient(base_url=sim.url, timeout=30) as http,
    ):
        started = time.monotonic()
        other = [*PROMPT[:-2], 5, 200006, 173781]  # differs in its last block: all but 16 cached later
        await asyncio.gather(
            http.post("/v1/completions", json=vllm_body(PROMPT, "p-1", stream=False)),
            http.post("/v1/completions", json=vllm_body([7, *PROMPT], "p-2", stream=False)),
        )
        both = time.monotonic() - started  # two whole prefills, one after the other
        started = time.monotonic()
        await http.post("/v1/completions", json=vllm_body(other, "p-3", stream=False))
        cached = time.monotonic() - started  # only its uncached tail
        assert both >= 2 * 0.3, both
        assert cached < both / 4, (cached, both)
