"""Settings shared by every service: where the bus is and which namespace to use.

Each service subclasses ``BusSettings`` once; it is built at start-up and passed down."""

from __future__ import annotations

import uuid

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.subjects import Subjects


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHORUS_", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias=AliasChoices("CHORUS_NATS_URL", "NATS_URL", "nats_url"),
    )
    namespace: str = "chorus"
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    log_level: str = "INFO"
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "CHORUS_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint"
        ),
    )

    heartbeat_interval_s: float = 0.25  # how often this instance says it is alive
    dead_after_s: float = 1.2  # a peer unheard for this long is counted dead
    gateway_dead_after_s: float = 10.0  # a gateway unheard for this long is counted dead (slow is not dead)
    drain_timeout_s: float = 30.0  # SIGTERM: finish the work in hand for at most this long
    liveness_file: str | None = None  # touched on every heartbeat (container healthchecks)
    # messages to one destination that come faster than this (ms) go out together, except
    # each generation's first tokens (its time to first token)
    coalesce_window_ms: float = 1.0

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.namespace)
