"""The router: a request goes to the engine that holds its prompt unless load outweighs it, the
view is the same in every dispatcher (notes over real NATS), a new dispatcher catches up from a
peer, and a dead dispatcher's generations stop loading their engines."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.kv_events import BlockStored, EventBatch, KvEvent
from services.dispatcher.fleet import Engine, parse_engines
from services.dispatcher.routing.blocks import chain_hashes
from services.dispatcher.routing.router import Router
from services.dispatcher.settings import Settings
from tests.bus import generate_request
from tests.waiting import until

ENGINES = ["vllm=http://a:8000", "vllm=http://b:8000", "vllm=http://c:8000"]
SYSTEM = list(range(1000, 1000 + 320))  # 20 blocks shared by every request


def prompt(conversation: int, turn: int) -> list[int]:
    own = [50_000 + conversation * 1000 + i for i in range(640)]  # 40 blocks of its own
    return [*SYSTEM, *own, *range(90_000, 90_000 + 16 * turn)]


def router(instance: str = "d1", **kw: object) -> tuple[Router, list[Engine]]:
    settings = Settings(engines=ENGINES, instance_id=instance, **kw)  # type: ignore[arg-type]
    engines = parse_engines(settings.engines)
    for engine in engines:
        engine.healthy = True
    return Router(settings, engines), engines


def send(r: Router, engines: list[Engine], conversation: int, turn: int) -> str:
    """Route one request, start it and let it decode; the engine's url."""
    req = generate_request(f"g{conversation}-{turn}-{uuid.uuid4().hex[:6]}", prompt(conversation, turn))
    engine = r.rank(req, engines)[0]
    r.started(req, engine)
    r.decoding(req)
    r.ended(req)
    return str(engine.url)


def test_conversations_stay_where_their_prompt_is_cached() -> None:
    """First turns arriving together spread by load (the shared system prompt is not worth a
    queue); every later turn goes back to the engine that holds its conversation."""
    r, engines = router()
    first = [generate_request(f"c{c}-0", prompt(c, 0)) for c in range(6)]
    homes = {}
    for c, req in enumerate(first):
        engine = r.rank(req, engines)[0]
        r.started(req, engine)  # still prefilling when the next one is ranked
        homes[c] = engine.url
    assert len(set(homes.values())) == 3
    for req in first:
        r.ended(req)
    for turn in range(1, 4):
        for c in range(6):
            assert send(r, engines, c, turn) == homes[c], (c, turn)


def test_load_outweighs_the_cache() -> None:
    """Generations still prefilling on the engine that holds the prompt make another engine
    cheaper: a shared prefix never pulls every request onto one engine."""
    r, engines = router(decode_weight=0.0)
    home = send(r, engines, 0, 0)
    busy = []
    for i in range(3):  # three long prefills queued on the home engine
        req = generate_request(f"busy-{i}", [7] * 4000)
        engine = next(e for e in engines if e.url == home)
        r._decisions.pop(req.generation_id, None)
        r.started(req, engine)
        busy.append(req)
    moved = send(r, engines, 0, 1)
    assert moved != home
    for req in busy:
        r.ended(req)
    assert send(r, engines, 0, 2) == moved  # where the longest prefix (turn 1's) now is


def test_engine_events_place_a_prompt_where_the_engine_stored_it() -> None:
    """KV events (the engine's own hashes, chained by parent) are what a KV-fed engine holds."""
    r, engines = router()
    ids = prompt(3, 0)
    blocks = len(ids) // 16
    r._on_batch(
        "http://c:8000", 0, _batch(BlockStored(tuple(range(500, 500 + blocks)), None, tuple(ids[: blocks * 16]), 16))
    )
    req = generate_request("kv", ids)
    ranked = r.rank(req, engines)
    assert ranked[0].url == "http://c:8000"
    assert r.expected_cached("kv", "http://c:8000") == blocks * 16
    r._on_reset("http://c:8000", "its stream broke")  # the view of it is dropped at once
    assert r.index.size("http://c:8000") == 0
    r.rank(generate_request("kv2", ids), engines)
    assert r.expected_cached("kv2", "http://c:8000") == 0


def test_a_resumed_generation_goes_where_its_output_is_cached() -> None:
    r, engines = router()
    ids = prompt(4, 0)
    output = list(range(120_000, 120_000 + 64))
    r.index.record_sent("http://b:8000", chain_hashes([*ids, *output], 16))
    r.index.record_sent("http://a:8000", chain_hashes(ids, 16))
    resumed = generate_request("resumed", ids, resume_tokens=output)
    assert r.rank(resumed, engines)[0].url == "http://b:8000"


def _batch(*events: KvEvent) -> EventBatch:
    return EventBatch(ts=0.0, events=tuple(events))


@contextlib.asynccontextmanager
async def joined(nats_url: str, namespace: str, instance: str) -> AsyncIterator[tuple[Router, list[Engine], Bus]]:
    r, engines = router(instance, nats_url=nats_url, namespace=namespace)
    bus = await Bus.connect(nats_url, f"router-{instance}", Subjects(namespace))
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            await r.join(bus, tg, stop)
            await bus.nc.flush()
            yield r, engines, bus
            stop.set()
    finally:
        await bus.close()


async def test_every_dispatcher_routes_on_the_same_view(nats_url: str, namespace: str) -> None:
    async with (
        joined(nats_url, namespace, "d1") as (one, engines_1, _),
        joined(nats_url, namespace, "d2") as (two, engines_2, _),
    ):
        homes = {c: send(one, engines_1, c, 0) for c in range(3)}
        # what d1 sent reaches d2: the same conversations go to the same engines from there
        await until(
            lambda: all(two.index.size(e.url) == one.index.size(e.url) for e in engines_2), 5, "d1's notes at d2"
        )
        for c in range(3):
            assert send(two, engines_2, c, 1) == homes[c]
        # a generation d2 has in flight loads the engine in d1's view too
        req = generate_request("held", prompt(9, 0))
        engine = two.rank(req, engines_2)[0]
        two.started(req, engine)
        await until(lambda: engine.url in one.loads(), 5, "d2's generation loading the engine in d1's view")
        # a dispatcher started now catches up from a peer
        async with joined(nats_url, namespace, "d3") as (three, engines_3, _):
            assert three.index.size(homes[0]) == one.index.size(homes[0]) > 0
            assert "held" in three.flights
            assert three._last_served.keys() == one._last_served.keys()  # the engines used lately
            assert send(three, engines_3, 1, 2) == homes[1]
        # d2 dies: its generation no longer loads the engine
        one.on_dispatcher_death("d2")
        # (d3's last notes may still be on their way)
        await until(lambda: engine.url not in one.loads(), 5, "the engine unloaded in d1's view after d2's death")
