"""Fan-out control messages and health pings."""

from __future__ import annotations

from typing import Literal

from contracts.messages.base import Contract


class Cancel(Contract):
    """The request is over for the client: abort the engine, drop the parser session."""

    kind: Literal["cancel"] = "cancel"
    request_id: str
    reason: str = "client_disconnected"


class Ping(Contract):
    kind: Literal["ping"] = "ping"


class Pong(Contract):
    kind: Literal["pong"] = "pong"
    service: str
    instance: str
    ready: bool = True
    detail: str = ""
