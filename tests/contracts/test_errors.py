"""``ErrorCode`` -> HTTP status and OpenAI error type, and the OpenAI error JSON a ``BusError``
becomes (contracts/errors.py; the gateway only looks these up)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.shared import ErrorObject

from contracts.errors import BusError, ErrorCode

# code: (wire value, HTTP status, OpenAI error type)
DECLARED: dict[ErrorCode, tuple[str, int, str]] = {
    ErrorCode.INVALID_REQUEST: ("invalid_request", 400, "invalid_request_error"),
    ErrorCode.MISSING_REQUIRED_PARAMETER: ("missing_required_parameter", 400, "invalid_request_error"),
    ErrorCode.UNKNOWN_PARAMETER: ("unknown_parameter", 400, "invalid_request_error"),
    ErrorCode.INVALID_TYPE: ("invalid_type", 400, "invalid_request_error"),
    ErrorCode.INVALID_VALUE: ("invalid_value", 400, "invalid_request_error"),
    ErrorCode.INTEGER_BELOW_MIN_VALUE: ("integer_below_min_value", 400, "invalid_request_error"),
    ErrorCode.INTEGER_ABOVE_MAX_VALUE: ("integer_above_max_value", 400, "invalid_request_error"),
    ErrorCode.DECIMAL_BELOW_MIN_VALUE: ("decimal_below_min_value", 400, "invalid_request_error"),
    ErrorCode.DECIMAL_ABOVE_MAX_VALUE: ("decimal_above_max_value", 400, "invalid_request_error"),
    ErrorCode.EMPTY_ARRAY: ("empty_array", 400, "invalid_request_error"),
    ErrorCode.ARRAY_BELOW_MIN_LENGTH: ("array_below_min_length", 400, "invalid_request_error"),
    ErrorCode.ARRAY_ABOVE_MAX_LENGTH: ("array_above_max_length", 400, "invalid_request_error"),
    ErrorCode.STRING_BELOW_MIN_LENGTH: ("string_below_min_length", 400, "invalid_request_error"),
    ErrorCode.STRING_ABOVE_MAX_LENGTH: ("string_above_max_length", 400, "invalid_request_error"),
    ErrorCode.INVALID_API_KEY: ("invalid_api_key", 401, "invalid_request_error"),
    ErrorCode.REQUEST_TOO_LARGE: ("request_too_large", 413, "invalid_request_error"),
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: ("unsupported_media_type", 415, "invalid_request_error"),
    ErrorCode.NOT_FOUND: ("not_found", 404, "invalid_request_error"),
    ErrorCode.MODEL_NOT_FOUND: ("model_not_found", 404, "invalid_request_error"),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: ("context_length_exceeded", 400, "invalid_request_error"),
    ErrorCode.ENGINE_UNAVAILABLE: ("engine_unavailable", 503, "server_error"),
    ErrorCode.ENGINE_ERROR: ("engine_error", 502, "server_error"),
    ErrorCode.SERVICE_UNAVAILABLE: ("service_unavailable", 503, "server_error"),
    ErrorCode.STORAGE_UNAVAILABLE: ("storage_unavailable", 503, "server_error"),
    ErrorCode.TIMEOUT: ("timeout", 504, "server_error"),
    ErrorCode.CANCELLED: ("cancelled", 499, "invalid_request_error"),  # nginx's "client closed request"
    ErrorCode.INTERNAL: ("internal_error", 500, "server_error"),
    ErrorCode.CONTINUATION_UNKNOWN: ("continuation_unknown", 503, "server_error"),  # between services only
}
TEXT = st.text(st.characters(codec="utf-8"))


def test_every_code_is_mapped() -> None:
    """A code added without a status would raise KeyError at the gateway, mid-request."""
    assert set(ErrorCode) == set(DECLARED)
    for code in ErrorCode:
        assert isinstance(code.http_status, int)


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_declared_mapping(code: ErrorCode) -> None:
    value, status, openai_type = DECLARED[code]
    assert (code.value, code.http_status, code.openai_type) == (value, status, openai_type)
    assert ErrorCode(value) is code


CALLER_MISTAKES = {
    ErrorCode.INVALID_REQUEST,
    ErrorCode.MISSING_REQUIRED_PARAMETER,
    ErrorCode.UNKNOWN_PARAMETER,
    ErrorCode.INVALID_TYPE,
    ErrorCode.INVALID_VALUE,
    ErrorCode.INTEGER_BELOW_MIN_VALUE,
    ErrorCode.INTEGER_ABOVE_MAX_VALUE,
    ErrorCode.DECIMAL_BELOW_MIN_VALUE,
    ErrorCode.DECIMAL_ABOVE_MAX_VALUE,
    ErrorCode.EMPTY_ARRAY,
    ErrorCode.ARRAY_BELOW_MIN_LENGTH,
    ErrorCode.ARRAY_ABOVE_MAX_LENGTH,
    ErrorCode.STRING_BELOW_MIN_LENGTH,
    ErrorCode.STRING_ABOVE_MAX_LENGTH,
    ErrorCode.INVALID_API_KEY,
    ErrorCode.REQUEST_TOO_LARGE,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    ErrorCode.NOT_FOUND,
    ErrorCode.MODEL_NOT_FOUND,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED,
}
STACK_FAILURES = {
    ErrorCode.ENGINE_UNAVAILABLE,
    ErrorCode.ENGINE_ERROR,
    ErrorCode.SERVICE_UNAVAILABLE,
    ErrorCode.STORAGE_UNAVAILABLE,
    ErrorCode.TIMEOUT,
    ErrorCode.INTERNAL,
    ErrorCode.CONTINUATION_UNKNOWN,
}


def test_caller_mistakes_are_4xx_and_stack_failures_5xx() -> None:
    """The split the gateway relies on (``http_status < 500``: do not retry, tell the caller)."""
    assert {c for c in ErrorCode if c.http_status < 500} == CALLER_MISTAKES | {ErrorCode.CANCELLED}
    assert {c for c in ErrorCode if c.openai_type == "server_error"} == STACK_FAILURES
    assert {c for c in ErrorCode if c.openai_type == "invalid_request_error"} == set(ErrorCode) - STACK_FAILURES


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_openai_body_is_openai_error_json(code: ErrorCode) -> None:
    error = BusError(code=code, message="Bad value for 'temperature'.", param="temperature", retryable=True)
    body = error.openai_body()
    assert body == {
        "error": {
            "message": "Bad value for 'temperature'.",
            "type": DECLARED[code][2],
            "param": "temperature",
            "code": DECLARED[code][0],
        }
    }
    assert "retryable" not in json.dumps(body)  # stays inside Chorus
    parsed = ErrorObject.model_validate(body["error"])
    assert (parsed.type, parsed.code, parsed.param) == (DECLARED[code][2], code.value, "temperature")


def test_bus_error_defaults_and_wire_form() -> None:
    error = BusError(code=ErrorCode.TIMEOUT, message="late")
    assert (error.kind, error.param, error.retryable) == ("error", None, False)
    assert json.loads(error.model_dump_json()) == {
        "kind": "error",
        "code": "timeout",
        "message": "late",
        "param": None,
        "retryable": False,
    }
    assert error.openai_body()["error"]["param"] is None


@given(st.sampled_from(list(ErrorCode)), TEXT, st.none() | TEXT, st.booleans())
def test_bus_error_round_trip(code: ErrorCode, message: str, param: str | None, retryable: bool) -> None:
    error = BusError(code=code, message=message, param=param, retryable=retryable)
    decoded = BusError.model_validate_json(error.model_dump_json())
    assert decoded == error
    assert decoded.code is code
    assert json.loads(json.dumps(decoded.openai_body())) == error.openai_body()
