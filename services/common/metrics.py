"""Prometheus metrics. The gateway serves them at /metrics; bus-only services serve them on
``CHORUS_METRICS_PORT`` when it is set (see ``serve_metrics``)."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Histogram, start_http_server

log = logging.getLogger("chorus.metrics")

REQUESTS = Counter("chorus_requests_total", "API requests by endpoint and outcome", ["api", "outcome"])
TIME_TO_FIRST_TOKEN = Histogram(
    "chorus_time_to_first_token_seconds", "From request arrival to the first model output",
    ["api"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
REQUEST_DURATION = Histogram(
    "chorus_request_duration_seconds", "Whole request duration", ["api"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
OUTPUT_TOKENS = Counter("chorus_output_tokens_total", "Completion tokens produced", ["api"])


def serve_metrics(port: int | None) -> None:
    if port:
        start_http_server(port)
        log.info("metrics on :%d/metrics", port)
