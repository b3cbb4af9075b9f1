"""Every NATS subject and header Chorus uses, built from the namespace. Nowhere else.

Subjects are fixed per role (or per worker instance), never per request: the request id
travels in the ``Chorus-Request-Id`` header so span names and subscriptions stay bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

REQUEST_ID_HEADER = "Chorus-Request-Id"
SEQ_HEADER = "Chorus-Seq"

# Queue groups: every replica of a service joins its group, NATS picks one per message.
ENCODER_QUEUE = "encoder"
DISPATCHER_QUEUE = "dispatcher"
PARSER_QUEUE = "parser"
TOOLS_QUEUE = "tools"

SERVICES = ("encoder", "dispatcher", "parser", "tools")


@dataclass(frozen=True)
class Subjects:
    namespace: str = "chorus"

    # request/reply (faststream handlers) ------------------------------------------------
    @property
    def encode(self) -> str:
        """EncodeRequest -> EncodeReply (EncodedPrompt | BusError)."""
        return f"{self.namespace}.encoder.encode"

    @property
    def generate(self) -> str:
        """GenerateRequest -> GenerateReply (GenerateAccepted | BusError); tokens follow on
        the request's ``token_subject``."""
        return f"{self.namespace}.dispatcher.generate"

    @property
    def parse_open(self) -> str:
        """ParseOpen -> ParseOpenReply (ParseOpened | BusError)."""
        return f"{self.namespace}.parser.open"

    @property
    def tools_list(self) -> str:
        """ListToolsRequest -> ListToolsReply."""
        return f"{self.namespace}.tools.list"

    @property
    def tools_call(self) -> str:
        """CallToolRequest -> CallToolReply."""
        return f"{self.namespace}.tools.call"

    def health(self, service: str) -> str:
        """Ping -> Pong, answered by one replica of ``service`` (queue group)."""
        return f"{self.namespace}.health.{service}"

    # fan-out -------------------------------------------------------------------------
    @property
    def cancel(self) -> str:
        """Cancel, broadcast to every dispatcher and parser (no queue group)."""
        return f"{self.namespace}.cancel"

    # streams (plain nats-py on the hot path) ------------------------------------------
    def parser_tokens(self, worker_id: str) -> str:
        """TokenBatch stream into one parser worker (dispatcher -> parser)."""
        return f"{self.namespace}.tokens.{worker_id}"

    @property
    def tokens_wildcard(self) -> str:
        """Every token stream: what a JetStream stream captures for replay."""
        return f"{self.namespace}.tokens.>"

    def gateway_events(self, gateway_id: str) -> str:
        """ParsedBatch stream into one gateway instance (parser -> gateway)."""
        return f"{self.namespace}.events.{gateway_id}"

    # redis ---------------------------------------------------------------------------
    def redis_key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))
