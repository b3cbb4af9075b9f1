"""Fan-out control messages: cancels and heartbeats."""

from __future__ import annotations

from typing import Literal

from contracts.messages.base import Contract


class Cancel(Contract):
    """Nobody waits for this generation any more: abort it in the engine, drop its parser
    session, and do not start it if it has not started (every service hears every cancel)."""

    kind: Literal["cancel"] = "cancel"
    generation_id: str
    reason: str = "client_disconnected"


class Heartbeat(Contract):
    """Every service instance says it is alive every ``interval_s`` seconds. Peers that need
    to know (the gateway: parsers, dispatchers, encoders; the dispatcher: gateways, parsers)
    count an instance dead after a few missed beats, so a death is noticed in about a second
    and parser workers are chosen without a round trip."""

    kind: Literal["heartbeat"] = "heartbeat"
    service: str
    instance: str
    interval_s: float
    ready: bool = True
    detail: str = ""
    load: int = 0  # what the instance is working on now (sessions, streams, renders)
    draining: bool = False  # finishing its work; send it nothing new
    stopping: bool = False  # the last beat of an instance that stops (no death to wait for)
    simulated: bool = False  # a dispatcher whose engines are the simulator: the gateway labels its answers


class CancelResponse(Contract):
    """Cancel a background response: the gateway running it stops it (any replica may be
    asked; every gateway hears this)."""

    kind: Literal["cancel_response"] = "cancel_response"
    response_id: str


class MetricsRequest(Contract):
    """The gateway scraping the stack: every service instance answers with its metrics."""

    kind: Literal["metrics_request"] = "metrics_request"


class MetricsSnapshot(Contract):
    kind: Literal["metrics"] = "metrics"
    service: str
    instance: str
    exposition: str  # Prometheus text format
