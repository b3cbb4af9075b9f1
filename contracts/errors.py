"""Error codes and the error payload that travels on reply subjects and event streams.

Caller mistakes (4xx) are kept apart from model / engine / bus failures (5xx)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict


class ErrorCode(StrEnum):
    # the caller's fault
    INVALID_REQUEST = "invalid_request"
    # a request body that does not validate, in OpenAI's own codes
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    UNKNOWN_PARAMETER = "unknown_parameter"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    INTEGER_BELOW_MIN_VALUE = "integer_below_min_value"
    INTEGER_ABOVE_MAX_VALUE = "integer_above_max_value"
    DECIMAL_BELOW_MIN_VALUE = "decimal_below_min_value"
    DECIMAL_ABOVE_MAX_VALUE = "decimal_above_max_value"
    EMPTY_ARRAY = "empty_array"
    ARRAY_BELOW_MIN_LENGTH = "array_below_min_length"
    ARRAY_ABOVE_MAX_LENGTH = "array_above_max_length"
    STRING_BELOW_MIN_LENGTH = "string_below_min_length"
    STRING_ABOVE_MAX_LENGTH = "string_above_max_length"
    INVALID_API_KEY = "invalid_api_key"
    REQUEST_TOO_LARGE = "request_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NOT_FOUND = "not_found"
    MODEL_NOT_FOUND = "model_not_found"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    # ours or upstream's
    ENGINE_UNAVAILABLE = "engine_unavailable"
    ENGINE_ERROR = "engine_error"
    SERVICE_UNAVAILABLE = "service_unavailable"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INTERNAL = "internal_error"
    # between services only: an encoder does not have the prompt a request continues (the
    # gateway sends the whole conversation instead)
    CONTINUATION_UNKNOWN = "continuation_unknown"

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @property
    def openai_type(self) -> str:
        return "invalid_request_error" if self.http_status < 500 else "server_error"


_HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.MISSING_REQUIRED_PARAMETER: 400,
    ErrorCode.UNKNOWN_PARAMETER: 400,
    ErrorCode.INVALID_TYPE: 400,
    ErrorCode.INVALID_VALUE: 400,
    ErrorCode.INTEGER_BELOW_MIN_VALUE: 400,
    ErrorCode.INTEGER_ABOVE_MAX_VALUE: 400,
    ErrorCode.DECIMAL_BELOW_MIN_VALUE: 400,
    ErrorCode.DECIMAL_ABOVE_MAX_VALUE: 400,
    ErrorCode.EMPTY_ARRAY: 400,
    ErrorCode.ARRAY_BELOW_MIN_LENGTH: 400,
    ErrorCode.ARRAY_ABOVE_MAX_LENGTH: 400,
    ErrorCode.STRING_BELOW_MIN_LENGTH: 400,
    ErrorCode.STRING_ABOVE_MAX_LENGTH: 400,
    ErrorCode.INVALID_API_KEY: 401,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,
    ErrorCode.ENGINE_UNAVAILABLE: 503,
    ErrorCode.ENGINE_ERROR: 502,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.STORAGE_UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.CANCELLED: 499,
    ErrorCode.INTERNAL: 500,
    ErrorCode.CONTINUATION_UNKNOWN: 503,
}


class BusError(BaseModel):
    """An error reply from any service; becomes OpenAI error JSON at the gateway."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: Literal["error"] = "error"
    code: ErrorCode
    message: str
    param: str | None = None
    # another attempt may succeed (an engine or a service on the path died): the gateway
    # resumes the generation instead of failing the request
    retryable: bool = False

    def openai_body(self) -> dict[str, dict[str, str | None]]:
        """The OpenAI error JSON a client sees (``retryable`` stays inside Chorus)."""
        return {
            "error": {
                "message": self.message,
                "type": self.code.openai_type,
                "param": self.param,
                "code": self.code.value,
            }
        }
