"""The SIMULATED engine's vLLM front end: ``POST /v1/completions`` with a token-id prompt, as
vLLM's OpenAI-compatible server answers it (``return_token_ids``, ``stop_reason``, usage chunk,
``data: {"error": ...}`` mid-stream, abort on client disconnect), plus ``GET /load``."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.simengine.constrained import Constrained
from services.simengine.generation import (
    EOS_TOKEN_IDS,
    Check,
    Generation,
    GrammarRefused,
    IncrementalText,
    SimRequestError,
    Unsupported,
    decode_text,
    prepare,
    runnable,
    stop_strings,
)
from services.simengine.grammar import GrammarError, check_schema, check_structural_tag
from services.simengine.matcher import Grammar, compile_choice, compile_json, compile_pattern, compile_tag
from services.simengine.settings import Settings
from services.simengine.state import Recorder, SimState

_CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class StructuredOutputs(BaseModel):
    """vLLM's StructuredOutputsParams: exactly one kind of constraint."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        fields = self.fields()
        count = sum(fields[k] is not None for k in _CONSTRAINT_KINDS)
        if count > 1:
            raise ValueError(
                f"You can only use one kind of structured outputs constraint but multiple are specified: {fields}"
            )
        if count < 1:
            raise ValueError(f"You must use one kind of structured outputs constraint but none are specified: {fields}")
        return self

    def fields(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class CompletionBody(BaseModel):
    """The fields of vLLM's CompletionRequest the simulator acts on; others are recorded."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[int] | str
    max_tokens: int | None = 16  # vLLM's default for /v1/completions; null = all the room left
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    request_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    structured_outputs: StructuredOutputs | None = None


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _invalid(message: str, parameter: str | None = None, value: object = None) -> SimRequestError:
    """vLLM's VLLMValidationError: 400, the parameter in ``param`` and after the message."""
    extras = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value)) if v is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    return SimRequestError(400, text, param=parameter)


def checks(body: CompletionBody, settings: Settings) -> Check:
    """What vLLM refuses before generating: its OpenAI server's ``_validate_input`` (prompt
    and max_tokens against max_model_len), SamplingParams (max_tokens >= 1), token ids in the
    vocabulary, and structured outputs that xgrammar cannot compile."""

    def check(prompt: list[int]) -> Constrained | None:
        n, limit = len(prompt), settings.max_model_len
        if n >= limit:
            raise _invalid(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"request has {n} input tokens. Please reduce the length of the input "
                "messages.",
                "input_tokens",
                n,
            )
        wanted = body.max_tokens
        if wanted is not None and n + wanted > limit:
            raise _invalid(
                f"'max_tokens' or 'max_completion_tokens' is too large: {wanted}. This "
                f"model's maximum context length is {limit} tokens and your request "
                f"has {n} input tokens ({wanted} > {limit} - {n}).",
                "max_tokens",
                wanted,
            )
        if wanted is not None and wanted < 1:
            raise _invalid(f"max_tokens must be at least 1, got {wanted}.", "max_tokens", wanted)
        for name in ("presence_penalty", "frequency_penalty"):  # vLLM's SamplingParams._verify_args
            value = getattr(body, name)
            if value is not None and not -2.0 <= value <= 2.0:
                raise _invalid(f"{name} must be in [-2, 2], got {value}.", name, value)
        if body.top_k is not None and body.top_k < -1:  # -1 and 0 disable it
            raise _invalid(f"top_k must be -1 (disable), or at least 1, got {body.top_k}.", "top_k", body.top_k)
        if any(not text for text in stop_strings(body.stop)):  # SamplingParams._verify_args
            raise _invalid("stop cannot contain an empty string.", "stop", body.stop)
        bad = max(prompt)
        if bad >= settings.vocab_size or min(prompt) < 0:
            raise _invalid(f"Token id {bad if bad >= settings.vocab_size else min(prompt)} is out of vocabulary")
        grammar = _structured(body.structured_outputs)
        if grammar is None:
            return None
        gated = settings.vllm_reasoning_gate and not settings.vllm_enable_in_reasoning
        return Constrained(grammar, "final" if gated else "output")

    return check


def _structured(params: StructuredOutputs | None) -> Grammar | None:
    """backend_xgrammar.validate_xgrammar_grammar: the constraint compiles, or a 400; then the
    grammar the simulated model generates through."""
    if params is None:
        return None
    if params.json_ is not None:
        try:
            schema = json.loads(params.json_) if isinstance(params.json_, str) else params.json_
        except ValueError as exc:
            raise GrammarRefused(400, "Invalid JSON grammar specification.") from exc
        try:
            check_schema(schema)
        except GrammarError as exc:
            raise GrammarRefused(400, f"Failed to transform json schema into a grammar: {exc}") from exc
        return compile_json(schema)
    if params.structural_tag is not None:
        try:
            tag = check_structural_tag(params.structural_tag)
        except GrammarError as exc:
            raise GrammarRefused(400, "Invalid structural tag specification.") from exc
        return runnable(lambda: compile_tag(tag))
    if params.regex is not None:
        try:
            re.compile(params.regex)
        except re.error as exc:
            raise GrammarRefused(400, f"Failed to transform regex into a grammar: {exc}") from exc
        regex = params.regex
        return runnable(lambda: compile_pattern(regex))
    if params.choice is not None:
        return compile_choice(params.choice)
    if params.json_object:
        return compile_json({"type": "object"})
    raise Unsupported(400, "The simulated engine cannot run this grammar: EBNF grammars are not supported.")


def _dumps(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _usage(gen: Generation, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": gen.prompt_tokens,
        "total_tokens": gen.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
    }


def _stop_reason(gen: Generation) -> int | str | None:
    """vLLM reports the matched stop string or stop token id, but null when generation ended
    on EOS."""
    if gen.outcome.stop_text is not None:
        return gen.outcome.stop_text
    stop = gen.outcome.stop_token_id
    return None if stop is None or stop in EOS_TOKEN_IDS else stop


async def completions(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    try:
        body = CompletionBody.model_validate_json(await request.body())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        message = f"{where}: {first['msg']}" if where else first["msg"]
        return JSONResponse(error_body(400, message, "BadRequestError"), status_code=400)
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = sim.encoding.encode(prompt, allowed_special="all")
    request_id = body.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex
    try:
        gen = prepare(
            sim.recorder,
            sim.encoding,
            sim.settings,
            request_id=request_id,
            protocol="vllm",
            prompt_ids=prompt,
            max_tokens=body.max_tokens,
            stop_token_ids=body.stop_token_ids or [],
            ignore_eos=body.ignore_eos,
            stop=stop_strings(body.stop),
            skip_special=body.skip_special_tokens,
            stream=body.stream,
            params=body.model_dump(exclude={"prompt"}, exclude_none=True, by_alias=True),
            check=checks(body, sim.settings),
        )
    except SimRequestError as exc:
        return JSONResponse(error_body(exc.status, exc.message, exc.kind, exc.param), status_code=exc.status)
    head = {
        "id": f"cmpl-{request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.model or sim.settings.served_model_name,
    }
    if body.stream:
        return StreamingResponse(_stream(sim, gen, body, head), media_type="text/event-stream")
    return await _whole(sim, gen, body, head)


async def _stream(sim: SimState, gen: Generation, body: CompletionBody, head: dict[str, Any]) -> AsyncIterator[bytes]:
    record = gen.record
    with_ids = bool(body.return_token_ids)
    text = IncrementalText(sim.encoding, body.skip_special_tokens)
    first, sent, completed = True, 0, False
    try:
        async for piece in gen.pieces():
            if piece.error is not None:
                Recorder.mark_finished(record, "error", piece.sent)
                completed = True
                yield _dumps(error_body(500, piece.error, "InternalServerError"))
                yield b"data: [DONE]\n\n"
                return
            choice: dict[str, Any] = {
                "index": 0,
                "text": text.feed(piece.token_ids, final=piece.last),
                "logprobs": None,
                "finish_reason": gen.outcome.finish_reason if piece.last else None,
                "stop_reason": _stop_reason(gen) if piece.last else None,
            }
            if with_ids:
                choice["token_ids"] = piece.token_ids
                if first:
                    choice["prompt_token_ids"] = record.prompt_token_ids
            first, sent = False, piece.sent
            if piece.last:
                Recorder.mark_finished(record, gen.outcome.finish_reason, sent)
                completed = True
            yield _dumps({**head, "choices": [choice], "usage": None})
        if not completed:  # aborted while paused between chunks
            return
        if body.stream_options is not None and body.stream_options.include_usage:
            yield _dumps({**head, "choices": [], "usage": _usage(gen, sent)})
        yield b"data: [DONE]\n\n"
    finally:
        if not completed:  # the client went away mid-stream: vLLM aborts the request
            Recorder.mark_aborted(record)


async def _whole(sim: SimState, gen: Generation, body: CompletionBody, head: dict[str, Any]) -> Response:
    ids: list[int] = []
    async for piece in gen.pieces():
        if piece.error is not None:
            Recorder.mark_finished(gen.record, "error", piece.sent)
            return JSONResponse(error_body(500, piece.error, "InternalServerError"), status_code=500)
        ids.extend(piece.token_ids)
    choice: dict[str, Any] = {
        "index": 0,
        "text": decode_text(sim.encoding, ids, body.skip_special_tokens),
        "logprobs": None,
        "finish_reason": gen.outcome.finish_reason,
        "stop_reason": _stop_reason(gen),
    }
    if body.return_token_ids:
        choice["token_ids"] = ids
        choice["prompt_token_ids"] = gen.record.prompt_token_ids
    Recorder.mark_finished(gen.record, gen.outcome.finish_reason, len(ids))
    return JSONResponse({**head, "choices": [choice], "usage": _usage(gen, len(ids))})


async def load(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    return JSONResponse({"server_load": sim.recorder.running})
