"""One exception hierarchy, split by whose fault a failure is (as pydantic-ai's ``UserError`` /
``AgentRunError`` and openai-agents' ``UserError`` / ``ModelBehaviorError``):

- ``CallerError``: the request is wrong (4xx); its message is for the caller, as it is.
- ``UpstreamError``: an engine or upstream failed or refused to work (5xx);
  ``ModelBehaviorError``: the model's output was unusable (no summary, an answer that breaks the
  requested format).
- ``StackError``: a part of Chorus failed (a service, the bus, a timeout; 5xx);
  ``StorageError``: Redis.

Every one carries the contract's ``BusError`` (the payload that travels on the bus);
``ChorusError.of(error)`` raises the class its code stands for, so a failure that came over the
bus keeps saying whose fault it is. What a client is shown is cleaned in one place
(``services/gateway/errors.py`` ``public``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from contracts.errors import BusError, ErrorCode

Fault = Literal["caller", "upstream", "stack"]


class ChorusError(Exception):
    fault: ClassVar[Fault] = "stack"

    def __init__(self, error: BusError) -> None:
        super().__init__(error.message)
        self.error = error

    @property
    def status_code(self) -> int:
        return self.error.code.http_status

    @staticmethod
    def of(error: BusError) -> ChorusError:
        """The exception for ``error``: its class says whose fault it is (from its code)."""
        if error.code.http_status < 500:
            return CallerError(error)
        if error.code in (ErrorCode.ENGINE_ERROR, ErrorCode.ENGINE_UNAVAILABLE):
            return UpstreamError(error)
        if error.code == ErrorCode.STORAGE_UNAVAILABLE:
            return StorageError(error)
        return StackError(error)


class CallerError(ChorusError):
    """The request cannot be served as sent (4xx)."""

    fault = "caller"


class UpstreamError(ChorusError):
    """An engine (or a text upstream) failed, refused or is unavailable (5xx)."""

    fault = "upstream"


class ModelBehaviorError(UpstreamError):
    """The model's output could not be used (5xx: the caller did nothing wrong)."""


class StackError(ChorusError):
    """A Chorus service, the bus, or a timeout inside the stack (5xx)."""

    fault = "stack"


class StorageError(StackError):
    """Response storage (Redis) is not available (503)."""


def model_behavior(message: str) -> ModelBehaviorError:
    return ModelBehaviorError(BusError(code=ErrorCode.ENGINE_ERROR, message=message))
