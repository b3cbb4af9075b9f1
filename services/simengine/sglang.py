"""The SIMULATED engine's SGLang front end: ``POST /generate`` with ``input_ids``, streamed
CUMULATIVELY (each chunk repeats everything so far, SGLang's default) or as deltas (like
``--incremental-streaming-output``), ``POST /abort_request``, ``GET /get_load``. It refuses
what SGLang refuses, as SGLang does: a streamed request it cannot take is HTTP 200 and one
``{"error": {"message"}}`` event (a grammar that does not compile: one abort chunk, status
400); without streaming, HTTP 400."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.simengine.constrained import Constrained
from services.simengine.generation import (
    Check,
    Generation,
    GrammarRefused,
    IncrementalText,
    SimRequestError,
    StatusDirective,
    Unsupported,
    decode_text,
    prepare,
    runnable,
    stop_strings,
)
from services.simengine.grammar import GrammarError, check_schema, check_structural_tag
from services.simengine.matcher import Grammar, compile_json, compile_pattern, compile_tag
from services.simengine.settings import Settings
from services.simengine.state import Recorder, SimState


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_new_tokens: int | None = 128  # SGLang's default; null: the room left in the context
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    ignore_eos: bool = False
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: Any = None  # a JSON string; SGLang does not check the type (msgspec)


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str | None = None
    input_ids: list[int] | None = None
    rid: str | None = None
    stream: bool = False
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    rid: str = ""
    abort_all: bool = False


def error_body(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "code": status}}


def room(settings: Settings, prompt_tokens: int) -> int:
    """The most new tokens SGLang's scheduler allows (``init_req_max_new_tokens``):
    ``max_req_len - len(input_ids) - 1``, ``max_req_len`` being ``context_len - 1``."""
    return max(0, settings.max_model_len - 1 - prompt_tokens - 1)


def checks(sp: SamplingParams, settings: Settings) -> Check:
    """What SGLang refuses before generating: TokenizerManager._validate_one_request (no
    --allow-auto-truncate), _validate_input_ids_in_vocab, SamplingParams.verify, and grammars
    its xgrammar backend cannot compile (the scheduler aborts those with a 400)."""

    def check(prompt: list[int]) -> Constrained | None:
        n, context = len(prompt), settings.max_model_len
        if n >= context:
            raise SimRequestError(
                400, f"The input ({n} tokens) is longer than the model's context length ({context} tokens)."
            )
        wanted = sp.max_new_tokens
        if wanted is not None and wanted + n >= context:
            raise SimRequestError(
                400,
                "Requested token count exceeds the model's maximum context length of "
                f"{context} tokens. You requested a total of {wanted + n} tokens: {n} tokens "
                f"from the input messages and {wanted} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the limit.",
            )
        if any(t >= settings.vocab_size for t in prompt):
            raise SimRequestError(
                400, f"The input_ids {prompt} contains values greater than the vocab size ({settings.vocab_size})."
            )
        _verify(sp)
        grammar = _grammar(sp)  # from the first output token (a /generate request does not reason first)
        return None if grammar is None else Constrained(grammar)

    return check


def _verify(sp: SamplingParams) -> None:
    """SamplingParams.verify, the checks on what Chorus sends."""
    if sp.temperature is not None and sp.temperature < 0:
        raise SimRequestError(400, f"temperature must be a non-negative finite number, got {sp.temperature}.")
    if sp.top_p is not None and not 0.0 < sp.top_p <= 1.0:
        raise SimRequestError(400, f"top_p must be in (0, 1], got {sp.top_p}.")
    if sp.top_k is not None and sp.top_k < 1 and sp.top_k != -1:
        raise SimRequestError(400, f"top_k must be -1 (disable), or at least 1, got {sp.top_k}.")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(sp, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise SimRequestError(400, f"{name} must be in [-2, 2], got {value}.")
    if sp.max_new_tokens is not None and sp.max_new_tokens < 0:
        raise SimRequestError(400, f"max_new_tokens must be at least 0, got {sp.max_new_tokens}.")
    if sum(g is not None for g in (sp.json_schema, sp.regex, sp.ebnf)) > 1:
        raise SimRequestError(400, "Only one of regex, json_schema, or ebnf can be set.")


def _grammar(sp: SamplingParams) -> Grammar | None:
    """The grammar key the scheduler compiles (json_schema, regex, ebnf, then structural_tag);
    one xgrammar cannot compile aborts the request: "Invalid grammar request: ..." (400)."""
    key: tuple[str, Any] | None = None
    for name, value in (
        ("json", sp.json_schema),
        ("regex", sp.regex),
        ("ebnf", sp.ebnf),
        ("structural_tag", sp.structural_tag or None),
    ):
        if value is not None:
            key = (name, value)
            break
    if key is None:
        return None
    kind, value = key
    try:
        if kind == "json":
            schema = json.loads(value) if value != "$$ANY$$" else True
            check_schema(schema)
            return compile_json(schema)
        if kind == "structural_tag":
            if not isinstance(value, str):
                raise GrammarError("the structural tag is not a string")
            tag = check_structural_tag(value)
            return runnable(lambda: compile_tag(tag))
        if kind == "regex":
            re.compile(value)
            return runnable(lambda: compile_pattern(value))
    except (GrammarError, ValueError, re.error) as exc:
        raise GrammarRefused(400, f"Invalid grammar request: req.grammar_key={key!r}") from exc
    raise Unsupported(400, "The simulated engine cannot run this grammar: EBNF grammars are not supported.")


def _dumps(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _finish(gen: Generation, count: int) -> dict[str, Any]:
    if gen.outcome.finish_reason == "length":
        return {"type": "length", "length": count}
    if gen.outcome.finish_reason == "abort":  # SGLang's FINISH_ABORT, as the scheduler reports it
        return {"type": "abort", "message": f"simulated engine abort after {count} tokens", "status_code": 500}
    matched = gen.outcome.stop_text if gen.outcome.stop_text is not None else gen.outcome.stop_token_id
    return {"type": "stop", "matched": matched}


def _meta(gen: Generation, finish: dict[str, Any] | None, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": gen.record.request_id,
        "finish_reason": finish,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": gen.cached_tokens,
    }


def _trimmed(gen: Generation, ids: list[int], no_stop_trim: bool) -> list[int]:
    """Without ``no_stop_trim`` SGLang drops the matched stop token from the output."""
    if not no_stop_trim and gen.outcome.stop_token_id is not None and ids:
        return ids[:-1]
    return ids


async def generate(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    try:
        body = GenerateBody.model_validate_json(await request.body())
    except ValidationError as exc:
        first = exc.errors()[0]
        return JSONResponse(error_body(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", 400), status_code=400)
    prompt = body.input_ids
    if prompt is None:
        prompt = sim.encoding.encode(body.text or "", allowed_special="all")
    sp = body.sampling_params
    rid = body.rid or uuid.uuid4().hex
    allowed = room(sim.settings, len(prompt))  # the scheduler clips, null included
    max_new = allowed if sp.max_new_tokens is None else min(sp.max_new_tokens, allowed)
    try:
        gen = prepare(
            sim.recorder,
            sim.encoding,
            sim.settings,
            request_id=rid,
            protocol="sglang",
            prompt_ids=prompt,
            max_tokens=max_new,
            stop_token_ids=sp.stop_token_ids or [],
            ignore_eos=sp.ignore_eos,
            stop=stop_strings(sp.stop),
            skip_special=sp.skip_special_tokens,
            stream=body.stream,
            params=body.model_dump(exclude={"input_ids", "text"}, exclude_none=True),
            check=checks(sp, sim.settings),
        )
    except StatusDirective as exc:
        return JSONResponse(error_body(exc.message, exc.status), status_code=exc.status)
    except SimRequestError as exc:
        if not body.stream:  # http_server: ValueError -> 400 {"error": {"message"}}
            return JSONResponse(error_body(exc.message, exc.status), status_code=exc.status)
        refusal = (
            _grammar_abort(rid, len(prompt), exc.message)
            if isinstance(exc, GrammarRefused)
            else {"error": {"message": exc.message}}
        )
        return StreamingResponse(_refused(refusal), media_type="text/event-stream")
    if body.stream:
        return StreamingResponse(_stream(sim, gen, sp), media_type="text/event-stream")
    return await _whole(sim, gen, sp)


def _abort_finish(message: str, status: int) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status}


def _grammar_abort(rid: str, prompt_tokens: int, message: str) -> dict[str, Any]:
    """The one chunk of a request whose grammar did not compile (FINISH_ABORT, 400)."""
    finish = {**_abort_finish(message, 400), "err_type": "BadRequestError"}
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 0,
        "cached_tokens": 0,
    }
    return {"text": "", "output_ids": [], "meta_info": meta}


async def _refused(event: dict[str, Any]) -> AsyncIterator[bytes]:
    """A streamed request SGLang refuses: HTTP 200, then the refusal as one event (the
    TokenizerManager's ValueError as ``{"error": {"message"}}``, a grammar abort as a chunk)."""
    yield _dumps(event)
    yield b"data: [DONE]\n\n"


async def _stream(sim: SimState, gen: Generation, sp: SamplingParams) -> AsyncIterator[bytes]:
    record = gen.record
    incremental = sim.settings.sglang_incremental
    text = IncrementalText(sim.encoding, sp.skip_special_tokens)
    ids: list[int] = []
    all_text, completed = "", False
    try:
        async for piece in gen.pieces():
            if piece.error is not None:  # SGLang ends a failed request with an abort finish
                Recorder.mark_finished(record, "error", piece.sent)
                completed = True
                finish = _abort_finish(piece.error, 500)
                yield _dumps(
                    {
                        "text": "" if incremental else all_text,
                        "output_ids": [] if incremental else ids,
                        "meta_info": _meta(gen, finish, piece.sent),
                    }
                )
                break
            delta = piece.token_ids
            if piece.last:
                delta = _trimmed(gen, delta, sp.no_stop_trim)
            ids.extend(delta)
            chunk_text = text.feed(delta, final=piece.last)
            all_text += chunk_text
            if piece.last:
                Recorder.mark_finished(record, gen.outcome.finish_reason, piece.sent)
                completed = True
            yield _dumps(
                {
                    "text": chunk_text if incremental else all_text,
                    "output_ids": delta if incremental else ids,
                    "meta_info": _meta(gen, _finish(gen, piece.sent) if piece.last else None, piece.sent),
                }
            )
        else:
            if not completed:  # POST /abort_request: SGLang answers with an abort finish
                completed = True
                yield _dumps(
                    {
                        "text": "" if incremental else all_text,
                        "output_ids": [] if incremental else ids,
                        "meta_info": _meta(gen, _abort_finish("Abort requested", 200), len(ids)),
                    }
                )
        yield b"data: [DONE]\n\n"
    finally:
        if not completed:  # the client went away: SGLang aborts the request too
            Recorder.mark_aborted(record)


async def _whole(sim: SimState, gen: Generation, sp: SamplingParams) -> Response:
    ids: list[int] = []
    async for piece in gen.pieces():
        if piece.error is not None:
            Recorder.mark_finished(gen.record, "error", piece.sent)
            return JSONResponse(error_body(piece.error, 500), status_code=500)
        ids.extend(piece.token_ids)
    if gen.record.aborted:
        finish = _abort_finish("Abort requested", 200)
    else:
        finish = _finish(gen, len(ids))
        Recorder.mark_finished(gen.record, gen.outcome.finish_reason, len(ids))
    out = _trimmed(gen, ids, sp.no_stop_trim) if finish["type"] == "stop" else ids
    return JSONResponse(
        {
            "text": decode_text(sim.encoding, out, sp.skip_special_tokens),
            "output_ids": out,
            "meta_info": _meta(gen, finish, len(ids)),
        }
    )


async def abort_request(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    try:
        body = AbortBody.model_validate_json(await request.body() or b"{}")
    except ValidationError as exc:
        return JSONResponse(error_body(str(exc), 400), status_code=400)
    targets = (
        [r for r in sim.recorder.records if r.protocol == "sglang" and not r.finished]
        if body.abort_all
        else [r for r in [sim.recorder.get(body.rid)] if r is not None]
    )
    for record in targets:
        Recorder.mark_aborted(record, via_abort_request=True)
    return Response(status_code=200)


async def get_load(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    running = sim.recorder.running
    return JSONResponse([{"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": 0}])
