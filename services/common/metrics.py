"""Prometheus metrics of every service, named once here.

The gateway serves ``/metrics`` for the whole stack: its own families, and those of every other
service instance, pulled over the bus when scraped (``services/common/telemetry`` has no part
in it). Buckets follow vLLM's for the latency histograms."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

REGISTRY = CollectorRegistry(auto_describe=True)
# every process's CPU seconds, resident memory and open files (labelled with its service and
# instance when the gateway merges them): which service costs what, per replica
ProcessCollector(registry=REGISTRY)

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)
HOP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

# -- gateway: per API request ---------------------------------------------------------------
REQUESTS = Counter(
    "chorus_requests_total", "API requests by API, model and outcome", ["api", "model", "outcome"], registry=REGISTRY
)
REQUEST_DURATION = Histogram(
    "chorus_request_duration_seconds",
    "Request duration, arrival to last byte",
    ["api", "model"],
    buckets=E2E_BUCKETS,
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "chorus_time_to_first_token_seconds",
    "Arrival to the first output text (reasoning, content or call)",
    ["api", "model"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
INTER_TOKEN_LATENCY = Histogram(
    "chorus_inter_token_latency_seconds",
    "Mean time between output tokens of a request, after the first",
    ["api", "model"],
    buckets=ITL_BUCKETS,
    registry=REGISTRY,
)
PROMPT_TOKENS = Counter("chorus_prompt_tokens_total", "Prompt tokens", ["api", "model"], registry=REGISTRY)
OUTPUT_TOKENS = Counter(
    "chorus_output_tokens_total", "Output tokens (reasoning included)", ["api", "model"], registry=REGISTRY
)
REASONING_TOKENS = Counter(
    "chorus_reasoning_tokens_total", "Output tokens on the analysis channel", ["api", "model"], registry=REGISTRY
)
IN_FLIGHT = Gauge("chorus_requests_in_flight", "API requests being answered", ["api"], registry=REGISTRY)
RESUMES = Counter(
    "chorus_generation_resumes_total",
    "Generations continued elsewhere after a process on their path died",
    ["reason"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter(
    "chorus_tool_calls_total",
    "MCP and built-in tool calls by server and outcome",
    ["server", "outcome"],
    registry=REGISTRY,
)
BUS_HOP = Histogram(
    "chorus_bus_hop_seconds",
    "Time between the gateway sending a generation and each stage answering",
    ["hop"],
    buckets=HOP_BUCKETS,
    registry=REGISTRY,
)

SCRAPE_INSTANCES = Gauge(
    "chorus_metrics_scrape_instances",
    "This scrape's service processes: expected (alive by their heartbeats) and answered in time; "
    "fewer answered than expected means some counters are missing from it",
    ["state"],
    registry=REGISTRY,
)

# -- dispatcher ------------------------------------------------------------------------------
ENGINE_UP = Gauge(
    "chorus_engine_up", "Engine health (1 up, 0 down), by engine and kind", ["engine", "kind"], registry=REGISTRY
)
ENGINE_IN_FLIGHT = Gauge(
    "chorus_engine_in_flight", "Generations streaming from an engine (this dispatcher's)", ["engine"], registry=REGISTRY
)

# -- parser -----------------------------------------------------------------------------------
RECOVERIES = Counter(
    "chorus_parser_recoveries_total", "Malformed model output repaired, by kind", ["kind"], registry=REGISTRY
)

# -- encoder ------------------------------------------------------------------------------------
RENDERS = Counter(
    "chorus_encoder_renders_total",
    "Prompts rendered, by kind: whole, continued (only the items after a remembered prompt), "
    "unknown (a continuation the encoder could not use: the gateway sent the whole conversation)",
    ["kind"],
    registry=REGISTRY,
)

# -- dispatcher: engines' KV cache events -----------------------------------------------------
KV_EVENTS = Counter(
    "chorus_kv_events_total",
    "KV cache events read from an engine's publisher, by outcome: applied and unknown (a type "
    "skipped) count events; replayed (applied from the replay socket), undecodable and gap count "
    "batches; reset counts the times the engine's cache view had to be dropped",
    ["engine", "outcome"],
    registry=REGISTRY,
)

# -- dispatcher: routing -------------------------------------------------------------------------
ROUTING_DECISIONS = Counter(
    "chorus_routing_decisions_total",
    "Engines chosen, by engine and reason: cache (the tokens it holds decided), load, round_robin",
    ["engine", "reason"],
    registry=REGISTRY,
)
ROUTING_INDEX_BLOCKS = Gauge(
    "chorus_routing_index_blocks", "Prompt blocks the routing view says an engine holds", ["engine"], registry=REGISTRY
)
ENGINE_PROMPT_TOKENS = Counter(
    "chorus_engine_prompt_tokens_total",
    "Prompt tokens per engine as the engine reported them: cached (found in its prefix cache) or prefilled",
    ["engine", "kind"],
    registry=REGISTRY,
)

# -- every service: its NATS connection ------------------------------------------------------
NATS_CONNECTION = Counter(
    "chorus_nats_connection_events_total",
    "This process's NATS connection: lost (its server died, stopped answering or closed it) and "
    "reconnected (to a server of the cluster, the same or another)",
    ["event"],
    registry=REGISTRY,
)

# -- gateway: Redis through failovers ------------------------------------------------------------
STORAGE_RETRIES = Counter(
    "chorus_storage_retries_total",
    "Redis operations through failures: retried (one per retry of an operation, its connection "
    "broken or its server demoted), recovered (an operation that succeeded after retrying), gave_up "
    "(the failover window ran out: storage unavailable), replicas_behind (a write fewer replicas "
    "acknowledged in time than CHORUS_REDIS_MIN_REPLICAS: storage unavailable), failover (a new "
    "primary noticed)",
    ["outcome"],
    registry=REGISTRY,
)
