"""Errors as a client sees them: the caller's mistakes named (``invalid``, ``not_found``), and
``public``, the one place a failure of the stack or an engine is cleaned for a client (what to
do, not where the engines are or which exception was raised: that is logged). The exceptions
themselves (``services/common/errors.py``) say whose fault a failure is."""

from __future__ import annotations

import logging

from contracts.errors import BusError, ErrorCode
from services.common.errors import CallerError

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


def invalid(message: str, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> CallerError:
    """A caller mistake (400) naming the offending parameter."""
    return CallerError(BusError(code=code, message=message, param=param))


def not_found(message: str, param: str | None = None) -> CallerError:
    return CallerError(BusError(code=ErrorCode.NOT_FOUND, message=message, param=param))


def public(error: BusError) -> BusError:
    """An error as a client may see it: failures of the stack say what to do, not where the
    engines are or which exception was raised (that is logged)."""
    message = PUBLIC_MESSAGES.get(error.code)
    if message is None:
        return error
    log.warning("%s: %s", error.code.value, error.message)
    return BusError(code=error.code, message=message, param=error.param)


STORAGE_DOWN = BusError(code=ErrorCode.STORAGE_UNAVAILABLE, message=PUBLIC_MESSAGES[ErrorCode.STORAGE_UNAVAILABLE])
# an engine that gave up on a generation itself (finish reason "abort"): the answer is cut
# short, which every API reports as the engine's failure, never as a finished answer
ABORTED = BusError(
    code=ErrorCode.ENGINE_ERROR,
    message="The engine stopped this generation before it finished (it was aborted): the answer is incomplete; "
    "try again.",
)
