"""OpenAI-shaped errors at the HTTP edge.

``ApiError`` carries a ``BusError``; the app's exception handlers turn it, FastAPI's
validation errors and anything unexpected into ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from contracts.errors import BusError, ErrorCode


class ApiError(Exception):
    def __init__(self, error: BusError) -> None:
        super().__init__(error.message)
        self.error = error

    @property
    def status_code(self) -> int:
        return self.error.code.http_status


def invalid(message: str, param: str | None = None) -> ApiError:
    """A caller mistake (400) naming the offending parameter."""
    return ApiError(BusError(code=ErrorCode.INVALID_REQUEST, message=message, param=param))


def not_found(message: str, param: str | None = None) -> ApiError:
    return ApiError(BusError(code=ErrorCode.NOT_FOUND, message=message, param=param))
