"""Settings shared by every service: where the bus is and which namespace to use.

Each service subclasses ``BusSettings`` once; it is built at start-up and passed down."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.subjects import Subjects
from services.common.wire_tls import tls_context


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHORUS_", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias=AliasChoices("CHORUS_NATS_URL", "NATS_URL", "nats_url"),
        description="The NATS servers every service connects to: one, or a cluster's, comma-separated "
        "(nats:// or tls://; the cluster's other servers are learnt from them). A dead one is skipped.",
    )
    nats_user: str | None = Field(default=None, description="NATS user (with nats_password).")
    nats_password: str | None = Field(default=None, description="NATS password.")
    nats_token: str | None = Field(default=None, description="NATS token authentication.")
    nats_nkey_seed_file: str | None = Field(
        default=None, description="A file holding an nkey seed (SU...): NATS nkey authentication."
    )
    nats_creds_file: str | None = Field(
        default=None, description="A NATS credentials file (a user JWT and its seed, as nsc writes them)."
    )
    nats_tls_ca: str | None = Field(
        default=None,
        description="CA file to verify the NATS servers' certificates (unset, with tls:// or a server "
        "requiring TLS: the system's trusted CAs).",
    )
    nats_tls_cert: str | None = Field(
        default=None, description="Client certificate for mutual TLS (with nats_tls_key)."
    )
    nats_tls_key: str | None = Field(default=None, description="The client certificate's key.")
    nats_tls_hostname: str | None = Field(
        default=None, description="The name the servers' certificates are checked against (default: each URL's host)."
    )
    nats_tls_handshake_first: bool = Field(
        default=False, description="TLS before NATS's INFO (servers with handshake_first)."
    )
    nats_jetstream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the JetStream data Chorus keeps (oversized payloads in flight): 3 on a "
        "three-node cluster, so a node's death loses none.",
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

    def nats_options(self) -> dict[str, Any]:
        """The NATS client's connection options from these settings (logins and TLS)."""
        options: dict[str, Any] = {}
        if self.nats_user:
            options |= {"user": self.nats_user, "password": self.nats_password or ""}
        if self.nats_token:
            options["token"] = self.nats_token
        if self.nats_nkey_seed_file:
            options["nkeys_seed"] = self.nats_nkey_seed_file
        if self.nats_creds_file:
            options["user_credentials"] = self.nats_creds_file
        if self.nats_tls_ca or self.nats_tls_cert:
            options["tls"] = tls_context(ca=self.nats_tls_ca, cert=self.nats_tls_cert, key=self.nats_tls_key)
        if self.nats_tls_hostname:
            options["tls_hostname"] = self.nats_tls_hostname
        if self.nats_tls_handshake_first:
            options["tls_handshake_first"] = True
        return options

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.namespace)
