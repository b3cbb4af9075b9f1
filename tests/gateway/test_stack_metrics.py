"""Merging the stack's metrics: every instance once, labelled with its service and instance."""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from contracts.messages.control import MetricsSnapshot
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.gateway.stack_metrics import gather, merge, own_exposition

OWN = (
    "# HELP chorus_tool_calls_total calls\n# TYPE chorus_tool_calls_total counter\n"
    'chorus_tool_calls_total{server="mcp",outcome="ok"} 3.0\n'
)
PARSER = (
    "# HELP chorus_parser_recoveries_total r\n# TYPE chorus_parser_recoveries_total counter\n"
    'chorus_parser_recoveries_total{kind="x"} 2.0\n'
)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def test_the_gateway_is_counted_once_though_it_answers_the_bus_request_too() -> None:
    merged = merge(
        OWN,
        "g1",
        [
            MetricsSnapshot(service="gateway", instance="g1", exposition=OWN),
            MetricsSnapshot(service="gateway", instance="g2", exposition=OWN),
            MetricsSnapshot(service="parser", instance="p1", exposition=PARSER),
        ],
    )
    got = samples(merged)
    calls = [(labels["instance"], v) for name, labels, v in got if name == "chorus_tool_calls_total"]
    assert sorted(calls) == [("g1", 3.0), ("g2", 3.0)]  # this gateway once, its replica too
    assert ("chorus_parser_recoveries_total", {"kind": "x", "service": "parser", "instance": "p1"}, 2.0) in got


def test_counters_are_typed_under_the_name_their_samples_carry() -> None:
    merged = merge(OWN, "g1", [])
    assert "# TYPE chorus_tool_calls_total counter" in merged.splitlines()


async def test_a_scrape_waits_for_every_service_process_not_for_as_many_answers(nats_url: str, namespace: str) -> None:
    """Gateways answer the bus request too, and fast (this one answers its own); their answers
    used to count towards the processes the heartbeats know, so a scrape could end before a
    worker's answer came and leave its counters out."""
    bus = await Bus.connect(nats_url, "scrape-test", Subjects(namespace))
    try:

        async def answer(instance: str, service: str, delay: float, msg: Any) -> None:
            await asyncio.sleep(delay)
            await bus.publish(msg.reply, MetricsSnapshot(service=service, instance=instance, exposition=PARSER))

        for instance, service, delay in (("g1", "gateway", 0.0), ("g2", "gateway", 0.0), ("w1", "worker", 0.0)):
            await bus.nc.subscribe(bus.subjects.metrics, cb=functools.partial(answer, instance, service, delay))
        await bus.nc.subscribe(bus.subjects.metrics, cb=functools.partial(answer, "w2", "worker", 0.3))
        beats = {
            "w1": SimpleNamespace(beat=SimpleNamespace(instance="w1")),
            "w2": SimpleNamespace(beat=SimpleNamespace(instance="w2")),
        }
        peers = SimpleNamespace(alive=lambda service: list(beats.values()) if service == "parser" else [])
        replies = await gather(bus, cast(Any, peers), ("parser",), timeout=5)
        assert sorted(r.instance for r in replies if r.service == "worker") == ["w1", "w2"]
        own = samples(own_exposition())
        assert ("chorus_metrics_scrape_instances", {"state": "answered"}, 2.0) in own
        assert ("chorus_metrics_scrape_instances", {"state": "expected"}, 2.0) in own
    finally:
        await bus.close()
