"""OpenAI-shaped errors at the HTTP edge.

``ApiError`` carries a ``BusError``; the app's exception handlers turn it, FastAPI's
validation errors and anything unexpected into ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

import logging

from contracts.errors import BusError, ErrorCode

log = logging.getLogger("chorus.gateway")

# what a client is told when the stack fails (the details go to the log)
PUBLIC_MESSAGES = {
    ErrorCode.ENGINE_UNAVAILABLE: "No model engine is available to take the request right now; try again shortly.",
    ErrorCode.SERVICE_UNAVAILABLE: "A Chorus service needed for this request is not available right now; "
    "try again shortly.",
    ErrorCode.TIMEOUT: "The request timed out inside Chorus.",
    ErrorCode.STORAGE_UNAVAILABLE: "Response storage (Redis) is not available right now; try again shortly, "
    "or send store: false.",
    ErrorCode.INTERNAL: "The server failed to answer this request; it has been logged.",
}


class ApiError(Exception):
    def __init__(self, error: BusError) -> None:
        super().__init__(error.message)
        self.error = error

    @property
    def status_code(self) -> int:
        return self.error.code.http_status


def invalid(message: str, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> ApiError:
    """A caller mistake (400) naming the offending parameter."""
    return ApiError(BusError(code=code, message=message, param=param))


def not_found(message: str, param: str | None = None) -> ApiError:
    return ApiError(BusError(code=ErrorCode.NOT_FOUND, message=message, param=param))


def public(error: BusError) -> BusError:
    """An error as a client may see it: failures of the stack say what to do, not where the
    engines are or which exception was raised (that is logged)."""
    message = PUBLIC_MESSAGES.get(error.code)
    if message is None:
        return error
    log.warning("%s: %s", error.code.value, error.message)
    return BusError(code=error.code, message=message, param=error.param)


STORAGE_DOWN = BusError(code=ErrorCode.STORAGE_UNAVAILABLE, message=PUBLIC_MESSAGES[ErrorCode.STORAGE_UNAVAILABLE])
