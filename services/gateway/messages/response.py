"""The Messages API's shapes that the streamed and the whole answer share (a ``tool_use``
block's input, usage, the stop reason), and Anthropic's error shapes and HTTP statuses for
Chorus's error codes. The whole ``Message`` (as ``anthropic.types.Message`` reads it) is built
from the answer's state in ``events.py``.

A ``tool_use`` block's ``input`` is the call's arguments parsed; arguments that are not a JSON
object (the model wrote something else and the parser could not repair it) are kept as
``{"_raw": text}``: never a 500, the client's tool validation tells the model, and the block
sent back renders the model's own text again (``items.arguments_of``).

``stop_sequence`` is the one of ``stop_sequences`` the engine matched (``stop_reason``
``stop_sequence``), as the parser's ``Finished`` reports it (see ``events.py``)."""

from __future__ import annotations

import json
from typing import Any

import orjson

from contracts.errors import ErrorCode
from contracts.messages.parse import FinishReason, Usage

RAW = "_raw"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a ``tool_use`` input: the JSON object, ``{}`` for none, else
    ``{"_raw": text}``."""
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:  # invalid, too deep, or a number past 64 bits: the slow reader
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return {RAW: arguments}
    return value if isinstance(value, dict) else {RAW: arguments}


def input_json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def stop_reason_of(finish_reason: FinishReason | None, called: bool, stop_sequence: str | None = None) -> str:
    """Anthropic's stop reason: ``max_tokens`` (out of budget), ``tool_use`` (the answer
    calls a tool), ``stop_sequence`` (one of ``stop_sequences`` matched), else ``end_turn``."""
    if finish_reason == "length":
        return "max_tokens"
    if called or finish_reason == "tool_calls":
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def usage_json(usage: Usage | None) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens not read from the prefix
    cache, ``cache_read_input_tokens`` those that were (when the engine says)."""
    u = usage or Usage()
    cached = u.cached_tokens
    out: dict[str, Any] = {
        "input_tokens": max(0, u.prompt_tokens - (cached or 0)),
        "output_tokens": u.completion_tokens,
    }
    if cached is not None:
        out["cache_read_input_tokens"] = cached
        out["cache_creation_input_tokens"] = 0
    return out


# -- errors ----------------------------------------------------------------------------------------
# Anthropic's error type and HTTP status where they are not "invalid_request_error" with the
# code's own 4xx, or "api_error" / 500 for the rest
_ERRORS: dict[ErrorCode, tuple[str, int]] = {
    ErrorCode.INVALID_API_KEY: ("authentication_error", 401),
    ErrorCode.NOT_FOUND: ("not_found_error", 404),
    ErrorCode.MODEL_NOT_FOUND: ("not_found_error", 404),
    ErrorCode.REQUEST_TOO_LARGE: ("request_too_large", 413),
    ErrorCode.ENGINE_UNAVAILABLE: ("overloaded_error", 529),
    ErrorCode.SERVICE_UNAVAILABLE: ("overloaded_error", 529),
    ErrorCode.STORAGE_UNAVAILABLE: ("overloaded_error", 529),
    ErrorCode.TIMEOUT: ("timeout_error", 504),
}


def error_type(code: ErrorCode) -> str:
    known = _ERRORS.get(code)
    if known is not None:
        return known[0]
    return "invalid_request_error" if code.http_status < 500 else "api_error"


def status_of(code: ErrorCode) -> int:
    known = _ERRORS.get(code)
    if known is not None:
        return known[1]
    return code.http_status if code.http_status < 500 else 500


def error_body(code: ErrorCode, message: str) -> dict[str, Any]:
    """Anthropic's error JSON: ``{"type": "error", "error": {"type": ..., "message": ...}}``."""
    return {"type": "error", "error": {"type": error_type(code), "message": message}}
