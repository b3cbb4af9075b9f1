"""SGLang: ``POST /generate`` with ``input_ids``, token ids back in ``output_ids``.

By default each chunk repeats everything so far (CUMULATIVE); with the server flag
``--incremental-streaming-output`` chunks are deltas. ``auto`` tells them apart per chunk from
``meta_info.completion_tokens`` (the total so far) against the ids already received.
``finish_reason`` is null, then ``{"type": "stop", "matched": ID}``, ``{"type": "length"}`` or
``{"type": "abort", "message"}``. A request SGLang refuses while streaming (its
TokenizerManager's ValueErrors: context length, sampling parameters) comes as HTTP 200 and one
``data: {"error": {"message"}}`` event. Aborting takes ``POST /abort_request {"rid"}``."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import orjson

from contracts.messages.generate import EngineUsage, GenerateRequest
from services.dispatcher.engines.base import (
    EngineChunk,
    engine_prompt,
    error_message,
    max_new_tokens,
    sampling_fields,
    status_error,
    token_ids,
)
from services.dispatcher.engines.constraints import sglang_structural_tag
from services.dispatcher.engines.http import EngineHttp, HttpError

Mode = Literal["auto", "cumulative", "incremental"]


def generate_body(req: GenerateRequest, default_max_tokens: int | None = None) -> dict[str, Any]:
    """``default_max_tokens``: the budget when the client set none; ``None`` sends null, which
    SGLang's scheduler clips to the room left in the context (``init_req_max_new_tokens``)."""
    limit = max_new_tokens(req)
    sampling: dict[str, Any] = {
        # always sent, null included: absent means SGLang's default of 128 new tokens. A number
        # reaching the context length is refused (TokenizerManager._validate_one_request: 400)
        "max_new_tokens": limit if limit is not None else default_max_tokens,
        "stop_token_ids": req.stop_token_ids,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    sampling.update(sampling_fields(req.sampling, {"seed": "sampling_seed"}))
    if (tag := sglang_structural_tag(req)) is not None:
        sampling["structural_tag"] = tag
    return {"input_ids": engine_prompt(req), "rid": req.generation_id, "stream": True, "sampling_params": sampling}


def _usage(meta: dict[str, Any]) -> EngineUsage | None:
    if "prompt_tokens" not in meta and "completion_tokens" not in meta:
        return None
    cached = meta.get("cached_tokens")
    return EngineUsage(
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or 0),
        cached_tokens=cached if isinstance(cached, int) else None,
    )


class SglangDecoder:
    # SGLang's /generate streams a request it refuses (ValueError: context length, sampling
    # parameters) as HTTP 200 and a ``data: {"error": {"message"}}`` event: a caller's mistake
    stream_error_status = 400

    def __init__(self, mode: Mode) -> None:
        self.mode: Mode = mode
        self.ids: list[int] = []  # everything received (needed to slice cumulative chunks)

    def _detect(self, out: list[int], completion: object, matched: int | None) -> Mode:
        """Cumulative or incremental, from one chunk (after the first)."""
        n, length = len(self.ids), len(out)
        if isinstance(completion, int):
            # a stop token trimmed by the server (not at the end) is counted but not sent
            trimmed = 1 if matched is not None and (not out or out[-1] != matched) else 0
            incremental = completion == n + length + trimmed
            cumulative = length == completion - trimmed
            if incremental != cumulative:
                return "incremental" if incremental else "cumulative"
        return "cumulative" if length >= n and out[:n] == self.ids else "incremental"

    def _delta(self, out: list[int], completion: object, matched: int | None) -> list[int]:
        if not self.ids:  # the first chunk reads the same either way, but: SGLang 0.5.2 starts
            # it with the prompt's last ids (sgl-project/sglang#10896): keep only what it counts
            if type(completion) is int and 0 <= completion < len(out):
                return out[len(out) - completion :]
            return out
        if self.mode == "auto":
            self.mode = self._detect(out, completion, matched)
        return out[len(self.ids) :] if self.mode == "cumulative" else out

    def feed(self, event: dict[str, Any]) -> EngineChunk | None:
        meta = event.get("meta_info") or {}
        out = event.get("output_ids")
        if out is None:
            return None
        finish = meta.get("finish_reason")
        matched = None
        if isinstance(finish, dict) and finish.get("type") == "stop":
            matched = finish.get("matched") if isinstance(finish.get("matched"), int) else None
        delta = self._delta(token_ids(out), meta.get("completion_tokens"), matched)
        self.ids.extend(delta)
        usage = _usage(meta)
        if not finish:
            return EngineChunk(token_ids=delta, usage=usage)
        kind = finish.get("type") if isinstance(finish, dict) else str(finish)
        if kind == "length":
            return EngineChunk(token_ids=delta, finish_reason="length", usage=usage)
        if kind == "abort":
            status = finish.get("status_code") if isinstance(finish, dict) else None
            message = error_message(finish, "the SGLang engine aborted the request")
            error = status_error(status if isinstance(status, int) else 500, message)
            return EngineChunk(token_ids=delta, finish_reason="error", usage=usage, error=error)
        matched = finish.get("matched") if isinstance(finish, dict) else None
        stop_id = matched if isinstance(matched, int) else None
        if stop_id is not None and (not self.ids or self.ids[-1] != stop_id):
            delta = [*delta, stop_id]  # trimmed by the server: make it part of the stream
            self.ids.append(stop_id)
        stop_text = matched if isinstance(matched, str) else None  # a stop string
        return EngineChunk(
            token_ids=delta, finish_reason="stop", stop_token_id=stop_id, usage=usage, stop_text=stop_text
        )


class SglangAdapter:
    kind = "sglang"
    resumable = True

    def __init__(self, mode: Mode = "auto", default_max_tokens: int | None = None) -> None:
        self.mode: Mode = mode
        self.default_max_tokens = default_max_tokens

    def request(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        return "/generate", generate_body(req, self.default_max_tokens)

    def decoder(self, req: GenerateRequest) -> SglangDecoder:
        return SglangDecoder(self.mode)

    async def abort(self, http: EngineHttp, base_url: str, request_id: str, timeout: float) -> None:
        with contextlib.suppress(HttpError):
            await http.request("POST", f"{base_url}/abort_request", orjson.dumps({"rid": request_id}), timeout=timeout)
