"""Every NATS subject Chorus uses, built from the namespace. Nowhere else.

Subjects are fixed per role (or per service instance), never per request, so span names and
subscriptions stay bounded; a generation's id travels inside the messages."""

from __future__ import annotations

from dataclasses import dataclass

# Queue groups: every replica of a service joins its group, NATS picks one per message.
ENCODER_QUEUE = "encoder"
DISPATCHER_QUEUE = "dispatcher"
TOOLS_QUEUE = "tools"

SERVICES = ("encoder", "dispatcher", "parser", "tools")

# Header naming an oversized payload kept in the object store (services.common.bus).
CLAIM_HEADER = "Chorus-Claim"


@dataclass(frozen=True)
class Subjects:
    namespace: str = "chorus"

    # the generation pipeline (frames: a hop carries a batch of its messages) ----------------
    @property
    def jobs(self) -> str:
        """GenerateJob, gateway -> encoder (queue group)."""
        return f"{self.namespace}.encoder.jobs"

    def encoder_jobs(self, encoder: str) -> str:
        """GenerateJob, gateway -> one encoder: the one in the worker process whose parser the
        gateway chose, so that the generation stays in that process."""
        return f"{self.namespace}.encoder.jobs.{encoder}"

    @property
    def encoder_count(self) -> str:
        """CountRequest -> TokenCount, gateway -> any encoder (queue group)."""
        return f"{self.namespace}.encoder.count"

    @property
    def generate(self) -> str:
        """GenerateRequest, encoder -> dispatcher (queue group)."""
        return f"{self.namespace}.dispatcher.generate"

    def parser_tokens(self, parser: str) -> str:
        """TokenFrame, dispatcher -> one parser worker."""
        return f"{self.namespace}.tokens.{parser}"

    def gateway_events(self, gateway: str) -> str:
        """EventFrame, encoder / dispatcher / parser -> one gateway instance."""
        return f"{self.namespace}.events.{gateway}"

    # request/reply (faststream handlers) ------------------------------------------------
    @property
    def tools_list(self) -> str:
        """ListToolsRequest -> ListToolsReply."""
        return f"{self.namespace}.tools.list"

    @property
    def tools_call(self) -> str:
        """CallToolRequest -> CallToolReply."""
        return f"{self.namespace}.tools.call"

    # fan-out ----------------------------------------------------------------------------
    @property
    def cancel(self) -> str:
        """Cancel, heard by every encoder, dispatcher and parser (no queue group)."""
        return f"{self.namespace}.cancel"

    @property
    def response_cancel(self) -> str:
        """CancelResponse, heard by every gateway (the one running the response acts)."""
        return f"{self.namespace}.responses.cancel"

    @property
    def metrics(self) -> str:
        """MetricsRequest -> a MetricsSnapshot from every service instance (no queue group)."""
        return f"{self.namespace}.metrics"

    def heartbeat(self, service: str) -> str:
        """Heartbeat of every instance of ``service``."""
        return f"{self.namespace}.heartbeat.{service}"

    @property
    def heartbeats(self) -> str:
        """Every service's heartbeats."""
        return f"{self.namespace}.heartbeat.*"

    # the dispatchers' shared view of the engines -----------------------------------------
    @property
    def routing_notes(self) -> str:
        """RouteNote, every dispatcher -> every dispatcher (fan-out)."""
        return f"{self.namespace}.routing.notes"

    @property
    def routing_snapshot(self) -> str:
        """SnapshotRequest -> a RoutingSnapshot from any dispatcher that has one."""
        return f"{self.namespace}.routing.snapshot"

    # outside NATS subjects, but namespaced the same way ----------------------------------
    @property
    def claims_stream(self) -> str:
        """The JetStream stream that carries payloads over NATS's message size limit."""
        return f"CLAIMS_{self.namespace}"
