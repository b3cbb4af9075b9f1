"""The SIMULATED engine's SGLang front end: ``POST /generate`` with ``input_ids``, streamed
CUMULATIVELY (each chunk repeats everything so far, SGLang's default) or as deltas (like
``--incremental-streaming-output``), ``POST /abort_request``, ``GET /get_load``."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.simengine.generation import (
    Generation,
    IncrementalText,
    SimRequestError,
    decode_text,
    prepare,
)
from services.simengine.state import Recorder, SimState


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_new_tokens: int | None = 128  # SGLang's default
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    ignore_eos: bool = False


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


def _dumps(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _finish(gen: Generation, count: int) -> dict[str, Any]:
    if gen.outcome.finish_reason == "length":
        return {"type": "length", "length": count}
    return {"type": "stop", "matched": gen.outcome.stop_token_id}


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
        return JSONResponse(
            error_body(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", 400), status_code=400
        )
    prompt = body.input_ids
    if prompt is None:
        prompt = sim.encoding.encode(body.text or "", allowed_special="all")
    sp = body.sampling_params
    rid = body.rid or uuid.uuid4().hex
    max_new = sp.max_new_tokens
    if max_new is not None:  # SGLang clips to the room left in the context
        max_new = max(0, min(max_new, sim.settings.max_model_len - len(prompt) - 1))
    try:
        gen = prepare(
            sim.recorder, sim.encoding, sim.settings,
            request_id=rid, protocol="sglang", prompt_ids=prompt, max_tokens=max_new,
            stop_token_ids=sp.stop_token_ids or [], ignore_eos=sp.ignore_eos, stream=body.stream,
            params=body.model_dump(exclude={"input_ids", "text"}, exclude_none=True),
        )
    except SimRequestError as exc:
        return JSONResponse(error_body(exc.message, exc.status), status_code=exc.status)
    if body.stream:
        return StreamingResponse(_stream(sim, gen, sp), media_type="text/event-stream")
    return await _whole(sim, gen, sp)


def _abort_finish(message: str, status: int) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status}


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
                yield _dumps({"text": "" if incremental else all_text,
                              "output_ids": [] if incremental else ids,
                              "meta_info": _meta(gen, finish, piece.sent)})
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
            yield _dumps({
                "text": chunk_text if incremental else all_text,
                "output_ids": delta if incremental else ids,
                "meta_info": _meta(gen, _finish(gen, piece.sent) if piece.last else None, piece.sent),
            })
        else:
            if not completed:  # POST /abort_request: SGLang answers with an abort finish
                completed = True
                yield _dumps({"text": "" if incremental else all_text,
                              "output_ids": [] if incremental else ids,
                              "meta_info": _meta(gen, _abort_finish("Abort requested", 200),
                                                 len(ids))})
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
    return JSONResponse({
        "text": decode_text(sim.encoding, out, sp.skip_special_tokens),
        "output_ids": out,
        "meta_info": _meta(gen, finish, len(ids)),
    })


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
