"""What every gateway route needs, built once at start-up (app.state.ctx)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contracts.errors import BusError, ErrorCode
from services.common.bus import Bus
from services.common.errors import ChorusError
from services.common.heartbeat import Peers
from services.gateway.generations import Generations
from services.gateway.settings import Settings
from services.gateway.store import ResponseStore

if TYPE_CHECKING:
    from fastapi import Request

    from services.gateway.sealing import Sealer


@dataclass
class GatewayContext:
    settings: Settings
    bus: Bus
    peers: Peers
    generations: Generations
    store: ResponseStore
    sealer: Sealer  # the server's key: encrypted reasoning, thinking signatures, compaction

    def simulated(self) -> bool:
        """Do this stack's engines include the simulator (its dispatchers say so)? Then every
        answer says it too (``X-Chorus-Simulator``, the models' owner)."""
        return any(peer.beat.simulated for peer in self.peers.alive("dispatcher"))

    def store_for(self, request: Request) -> ResponseStore:
        """The store as the caller's API key sees it (all of it without keys)."""
        return self.store.scoped(getattr(request.state, "tenant", None))

    def served_model(self, model: str) -> str:
        """The served model ``model`` names: itself, or the one an alias maps it to
        (``model_aliases``); a 404 otherwise."""
        if model in self.settings.models:
            return model
        for pattern, target in self.settings.model_aliases.items():
            if fnmatch.fnmatchcase(model, pattern):
                return target or self.settings.models[0]
        self.check_model(model)
        return model

    def check_model(self, model: str) -> None:
        if model not in self.settings.models:
            raise ChorusError.of(
                BusError(
                    code=ErrorCode.MODEL_NOT_FOUND,
                    param="model",
                    message=f"The model '{model}' does not exist; this server serves: "
                    + ", ".join(self.settings.models),
                )
            )


def get_ctx(request: Request) -> GatewayContext:
    ctx: GatewayContext = request.app.state.ctx
    return ctx
