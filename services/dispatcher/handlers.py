"""Bus handlers: typed message in, the dispatcher's answer out."""

from __future__ import annotations

import logging

from faststream import ExceptionMiddleware
from faststream.nats import NatsBroker
from pydantic import ValidationError

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.generate import GenerateAccepted, GenerateRequest
from contracts.subjects import DISPATCHER_QUEUE
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings

log = logging.getLogger("chorus.dispatcher")


def error_replies() -> ExceptionMiddleware:
    """A request the dispatcher cannot read, or a bug, still gets a typed error reply."""
    middleware = ExceptionMiddleware()

    @middleware.add_handler(ValidationError, publish=True)
    def _invalid(exc: ValidationError) -> BusError:
        errors = exc.errors()
        loc, msg = (errors[0]["loc"], errors[0]["msg"]) if errors else ((), "unreadable")
        where = ".".join(str(p) for p in loc[1:])  # loc[0] is the handler's argument
        what = f"{where}: {msg}" if where else msg
        return BusError(code=ErrorCode.INVALID_REQUEST,
                        message=f"invalid message for the dispatcher: {what}", param=where or None)

    @middleware.add_handler(Exception, publish=True)
    def _internal(exc: Exception) -> BusError:
        log.exception("dispatcher handler failed", exc_info=exc)
        return BusError(code=ErrorCode.INTERNAL, message=f"dispatcher error: {type(exc).__name__}")

    return middleware


def register(broker: NatsBroker, settings: Settings, dispatcher: Dispatcher) -> None:
    subjects = settings.subjects
    broker.add_middleware(error_replies())

    @broker.subscriber(subjects.generate, queue=DISPATCHER_QUEUE,
                       max_workers=max(1, settings.handler_workers))
    async def generate(req: GenerateRequest) -> GenerateAccepted | BusError:
        return await dispatcher.generate(req)

    # no queue group: every dispatcher hears every cancel, the owner acts on it
    @broker.subscriber(subjects.cancel)
    async def cancel(msg: Cancel) -> None:
        dispatcher.cancel(msg.request_id)
