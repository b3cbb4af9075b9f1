"""What every gateway route needs, built once at start-up (app.state.ctx)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.gateway.pipeline import Pipeline
from services.gateway.settings import Settings

if TYPE_CHECKING:
    from fastapi import Request


@dataclass
class GatewayContext:
    settings: Settings
    pipeline: Pipeline
    store: Any = None  # services.gateway.store.ResponseStore (Redis), set by app.py
    tools: Any = None  # a tools-service client for the MCP loop, set by app.py

    def check_model(self, model: str) -> None:
        from contracts.errors import BusError, ErrorCode
        from services.gateway.errors import ApiError

        if model not in self.settings.models:
            raise ApiError(
                BusError(
                    code=ErrorCode.MODEL_NOT_FOUND,
                    message=f"The model '{model}' does not exist; this server serves: "
                    + ", ".join(self.settings.models),
                    param="model",
                )
            )


def get_ctx(request: Request) -> GatewayContext:
    ctx: GatewayContext = request.app.state.ctx
    return ctx
