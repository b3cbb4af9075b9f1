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
        description="The NATS server every service connects to (credentials: CHORUS_NATS_USER / CHORUS_NATS_PASSWORD).",
    )
    namespace: str = Field(
        default="chorus",
        description="Prefix of every NATS subject and Redis key: stacks with different namespaces "
        "share one NATS and Redis without seeing each other.",
    )
    instance_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex[:12],
        description="This process's name on the bus (heartbeats, metrics labels, its own "
        "subjects); leave it unset so every replica makes its own.",
    )
    log_level: str = Field(default="INFO", description="Python log level (DEBUG, INFO, WARNING, ERROR).")
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CHORUS_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint"),
        description="OTLP/HTTP endpoint traces are exported to (e.g. http://jaeger:4318); unset: no tracing.",
    )

    heartbeat_interval_s: float = Field(default=0.25, description="How often this instance says it is alive (seconds).")
    dead_after_s: float = Field(
        default=1.2, description="A peer unheard for this long (seconds) is counted dead and its work resumed."
    )
    gateway_dead_after_s: float = Field(
        default=10.0,
        description="A gateway unheard for this long (seconds) is counted dead and its generations "
        "aborted (longer than dead_after_s: a slow gateway must not lose its streams).",
    )
    drain_timeout_s: float = Field(
        default=30.0, description="On SIGTERM, finish the work in hand for at most this long (seconds)."
    )
    liveness_file: str | None = Field(
        default=None, description="A file touched on every heartbeat (container healthchecks); unset: none."
    )
    coalesce_window_ms: float = Field(
        default=1.0,
        description="Messages to one destination that come faster than this (ms) go out "
        "together, except each generation's first tokens (its time to first token).",
    )
    coalesce_max_window_ms: float = Field(
        default=40.0,
        description="Under load the dispatcher's window grows with the generations it streams "
        "(the window above times their number) up to this (ms): each generation's tokens then "
        "travel several to a message (a stream's text arrives in steps of up to this much; its "
        "first tokens never wait). 0: the window never grows.",
    )

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.namespace)
