"""The services docker-compose.yml runs, by role, for the compose tests: the Chorus services on
the bus, the ones composed (workers, not their split parts), the NATS cluster's nodes, the Redis
nodes and their sentinels; and the host environment stripped of what would interpolate into the
file."""

from __future__ import annotations

import os

from services.cli import SERVICE_MODULES

BUS_SERVICES = ("worker", "tools", "gateway")  # on NATS, with a heartbeat
# compose runs `chorus up`'s shape: workers, each an encoder, a dispatcher and a parser; these
# run alone only in a deployment that splits them (the file's comment says how)
SPLIT_ONLY = {"encoder", "dispatcher", "parser"}
COMPOSED = sorted(set(SERVICE_MODULES) - SPLIT_ONLY)
NATS_NODES = ("nats-1", "nats-2", "nats-3")  # one cluster
REDIS_NODES = ("redis", "redis-replica")  # the first primary, its replica
SENTINELS = ("redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3")
INFRA_SERVICES = (*NATS_NODES, *REDIS_NODES, *SENTINELS, "jaeger", "prometheus", "grafana")


def clean_env() -> dict[str, str]:
    """This process's environment without the variables docker-compose.yml reads."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CHORUS_", "OTEL_", "GF_", "JAEGER_", "GRAFANA_", "PROMETHEUS_"))
        and k not in ("NATS_URL", "REDIS_URL")
    }
