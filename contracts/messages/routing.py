"""What the dispatchers tell each other about the engines, so that every one of them routes on
the same view (fan-out, no queue group): which engine each generation went to and where it is
(prefilling its uncached prompt, decoding, done), and, for engines without KV cache events,
which prompt blocks the stack sent there. A dispatcher that starts asks a peer for a snapshot
of the whole view; the engines' own KV events each dispatcher reads from the engine itself."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from contracts.messages.base import Contract

Phase = Literal["prefill", "decode", "done"]


class RouteNote(Contract):
    """A generation of ``dispatcher`` on ``engine`` entered ``phase``. With ``prefill``: the
    prompt tokens the engine must prefill (``prefill_tokens``, the prompt minus what it was
    expected to hold) and, for an engine without KV events, the chain hashes of the prompt's
    blocks (``blocks``, of ``block_size`` tokens) it now holds."""

    kind: Literal["route"] = "route"
    dispatcher: str
    generation_id: str
    engine: str
    phase: Phase
    prefill_tokens: int = 0
    context_tokens: int = 0  # the generation's prompt: what it holds on the engine while decoding
    block_size: int = 0
    blocks: list[int] = Field(default_factory=list)


class SnapshotRequest(Contract):
    kind: Literal["routing_snapshot_request"] = "routing_snapshot_request"
    dispatcher: str  # who asks (it does not answer itself)


class RoutingSnapshot(Contract):
    """A dispatcher's whole view: the prefix index (``PrefixIndex.snapshot``), the last KV
    event batch applied per engine, the generations in flight, and how long ago each engine last
    finished one (seconds: clocks differ between processes, durations do not)."""

    kind: Literal["routing_snapshot"] = "routing_snapshot"
    index: dict[str, Any]
    kv_seq: dict[str, int] = Field(default_factory=dict)
    in_flight: list[RouteNote] = Field(default_factory=list)
    served_ago: dict[str, float] = Field(default_factory=dict)
