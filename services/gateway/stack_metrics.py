"""``GET /metrics``: the whole stack's metrics from one place.

The gateway asks every service instance for its metrics over the bus (one request, every
instance answers, for at most ``timeout`` seconds or until every instance the heartbeats know
has answered), adds ``service`` and ``instance`` labels, merges the families and serves them
with its own. No service needs a port of its own, so a stack of processes on one machine never
clashes, and a scrape sees every replica."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from contracts.messages.control import MetricsRequest, MetricsSnapshot
from services.common.bus import Bus, dump
from services.common.heartbeat import Peers
from services.common.metrics import REGISTRY, SCRAPE_INSTANCES


async def gather(bus: Bus, peers: Peers, services: tuple[str, ...], timeout: float) -> list[MetricsSnapshot]:
    """Every service process's snapshot that answers within ``timeout``; how many were expected
    and how many answered goes into this scrape (``chorus_metrics_scrape_instances``)."""
    # one answer per process: a worker beats as its three roles (encoder, dispatcher, parser)
    # under one instance id, and answers once. Gateways answer too (this one included) but are
    # not among the expected: counting their answers ended the wait before a worker's came
    expected = {p.beat.instance for s in services for p in peers.alive(s)}
    replies: list[MetricsSnapshot] = []
    answered: set[str] = set()
    done = asyncio.Event()
    inbox = bus.nc.new_inbox()

    async def on_reply(msg: object) -> None:
        with contextlib.suppress(ValueError):
            reply = MetricsSnapshot.model_validate_json(getattr(msg, "data", b""))
            replies.append(reply)
            if reply.instance in expected:
                answered.add(reply.instance)
        if answered >= expected:
            done.set()

    sub = await bus.nc.subscribe(inbox, cb=on_reply)
    try:
        await bus.nc.publish(bus.subjects.metrics, dump(MetricsRequest()), reply=inbox)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await done.wait()
    finally:
        await sub.unsubscribe()
    SCRAPE_INSTANCES.labels("expected").set(len(expected))
    SCRAPE_INSTANCES.labels("answered").set(len(answered))
    return replies


def merge(own: str, own_instance: str, snapshots: list[MetricsSnapshot]) -> str:
    """One exposition from several: samples labelled with their service and instance."""
    families: dict[str, tuple[str, str, list[Sample]]] = {}
    # this gateway answers the bus request too: its registry is counted once, from ``own``
    sources = [
        ("gateway", own_instance, own),
        *((s.service, s.instance, s.exposition) for s in snapshots if s.instance != own_instance),
    ]
    for service, instance, text in sources:
        for family in text_string_to_metric_families(text):
            kind, doc, samples = families.setdefault(family.name, (family.type, family.documentation, []))
            for sample in family.samples:
                samples.append(sample._replace(labels={**sample.labels, "service": service, "instance": instance}))
    lines: list[str] = []
    for name, (kind, doc, samples) in sorted(families.items()):
        if kind == "counter":  # the parser names a counter's family without the suffix it writes
            name += "_total"
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        for sample in samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


def own_exposition() -> str:
    return generate_latest(REGISTRY).decode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))
