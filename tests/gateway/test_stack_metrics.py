"""Merging the stack's metrics: every instance once, labelled with its service and instance."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from contracts.messages.control import MetricsSnapshot
from services.gateway.stack_metrics import merge

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
