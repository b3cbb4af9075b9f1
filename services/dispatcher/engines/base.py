"""What every engine adapter provides, and the protocol-neutral shape of an engine stream.

An adapter knows one engine's HTTP protocol: the request body for a ``GenerateRequest``, how
to turn the engine's stream events into ``EngineChunk`` (token id delta, finish reason, stop
token, usage, error), and how to abort. Opening the stream, SSE framing and HTTP errors are
shared (``engines/stream.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import EngineFinishReason, EngineUsage, GenerateRequest, SamplingParams
from services.dispatcher.engines.http import EngineHttp

_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "too long",
    "max_model_len",
    "maximum allowed length",
)
# vLLM before 0.12 writes every mid-stream exception as a 400, its engine's death included
_ENGINE_FAULT_HINTS = ("enginecore encountered an issue", "enginedeaderror", "enginegenerateerror")


@dataclass(slots=True)  # not frozen: one per token, and a frozen __init__ costs twice as much
class EngineChunk:
    """One engine stream event, normalised: ``token_ids`` is a delta. Not changed once made."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: EngineFinishReason | None = None
    stop_token_id: int | None = None
    usage: EngineUsage | None = None
    error: BusError | None = None  # the engine failed mid-stream
    stop_text: str | None = None  # the stop string that ended the output (its tokens included)


class EngineFailure(Exception):
    """The engine could not take the request; ``retryable``: another worker may."""

    def __init__(self, error: BusError, *, retryable: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.retryable = retryable


class StreamDecoder(Protocol):
    """Per-request state turning engine stream events into chunks. A decoder may say what an
    ``{"error": ...}`` event without a ``code`` means in its protocol (``stream_error_status``,
    an HTTP status; 500 when it does not)."""

    def feed(self, event: dict[str, Any]) -> EngineChunk | None: ...


class EngineAdapter(Protocol):
    kind: str  # vllm | sglang
    resumable: bool  # can continue an output from its tokens (token-id prompts can)

    def request(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        """The path and JSON body of a streaming generate call."""
        ...

    def decoder(self, req: GenerateRequest) -> StreamDecoder: ...

    async def abort(self, http: EngineHttp, base_url: str, request_id: str, timeout: float) -> None:
        """Stop the request in the engine (beyond closing the stream, if the protocol needs it)."""
        ...


def engine_prompt(req: GenerateRequest) -> list[int]:
    """The prompt the engine sees: the rendered prompt, then the output of an earlier attempt
    (the engine continues it; a prefix cache makes that cheap)."""
    if not req.resume_tokens:
        return req.prompt_token_ids
    return [*req.prompt_token_ids, *req.resume_tokens]


# the sampling fields every engine takes by the same meaning: our name -> the OpenAI / vLLM name
SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
}


def sampling_fields(s: SamplingParams, renamed: dict[str, str] | None = None) -> dict[str, Any]:
    """The request's sampling fields that are set, under the engine's names (``SAMPLING``,
    with ``renamed`` where an engine differs: SGLang's ``sampling_seed``); ``stop`` when any."""
    names = {**SAMPLING, **(renamed or {})}
    out: dict[str, Any] = {names[field]: value for field in SAMPLING if (value := getattr(s, field)) is not None}
    if s.stop:
        out["stop"] = s.stop
    return out


def max_new_tokens(req: GenerateRequest) -> int | None:
    """The output budget left (``None``: as much as the context allows)."""
    limit = req.sampling.max_tokens
    if limit is None:
        return None
    return max(1, limit - len(req.resume_tokens))


def token_ids(value: Any) -> list[int]:
    """Token ids from an engine event; ``ValueError`` when they are not a list of ints."""
    if type(value) is list:
        for t in value:  # a loop, not all(<generator>): this runs once per token
            if type(t) is not int or t < 0:
                break
        else:
            return value
    raise ValueError(f"token ids must be a list of non-negative ints, got {str(value)[:80]}")


def status_error(status: int, message: str) -> BusError:
    """An error an engine reported inside its answer (a mid-stream event, an abort) with an HTTP
    status: 4xx is the caller's (unless the message says the engine died), 503 or a dead engine
    something another worker may not have (retryable), anything else the engine's."""
    engine_died = any(hint in message.lower() for hint in _ENGINE_FAULT_HINTS)
    if 400 <= status < 500 and not engine_died:
        return error_for_status(status, message)
    if status == 503 or engine_died:  # another engine may well continue it
        return BusError(code=ErrorCode.ENGINE_UNAVAILABLE, message=message, retryable=True)
    return BusError(code=ErrorCode.ENGINE_ERROR, message=message)


def error_for_status(status: int, message: str) -> BusError:
    """An engine's HTTP error status, in the bus's terms (caller mistakes stay 4xx)."""
    if status == 404:
        return BusError(code=ErrorCode.MODEL_NOT_FOUND, message=message)
    if status == 408:
        return BusError(code=ErrorCode.TIMEOUT, message=message)
    if 400 <= status < 500 and status != 429:
        lowered = message.lower()
        if any(hint in lowered for hint in _CONTEXT_HINTS):
            return BusError(code=ErrorCode.CONTEXT_LENGTH_EXCEEDED, message=message)
        return BusError(code=ErrorCode.INVALID_REQUEST, message=message)
    return BusError(code=ErrorCode.ENGINE_ERROR, message=message)


def error_message(payload: Any, default: str) -> str:
    """The message of an engine error body: ``{"error": {"message"}}`` (vLLM, SGLang),
    ``{"message"}`` (older vLLM), ``{"detail"}`` (FastAPI), or the text itself."""
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if isinstance(inner.get(key), str) and inner[key]:
                    return str(inner[key])
        if isinstance(inner, str) and inner:
            return inner
        if isinstance(payload.get("detail"), str):
            return str(payload["detail"])
    if isinstance(payload, str) and payload.strip():
        return payload.strip()[:500]
    return default
