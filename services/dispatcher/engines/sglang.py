"""SGLang: ``POST /generate`` with ``input_ids``, token ids back in ``output_ids``.

By default each chunk repeats everything so far (CUMULATIVE); with the server flag
``--incremental-streaming-output`` chunks are deltas. ``auto`` tells them apart per chunk from
``meta_info.completion_tokens`` (the total so far) against the ids already received.
``finish_reason`` is null, then ``{"type": "stop", "matched": ID}``, ``{"type": "length"}`` or
``{"type": "abort", "message"}``. Aborting takes ``POST /abort_request {"rid"}``."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import httpx

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import EngineUsage, GenerateRequest
from services.dispatcher.engines.base import (
    EngineChunk,
    error_for_status,
    error_message,
    token_ids,
)

Mode = Literal["auto", "cumulative", "incremental"]


def generate_body(req: GenerateRequest, default_max_tokens: int) -> dict[str, Any]:
    s = req.sampling
    sampling: dict[str, Any] = {
        # always set: SGLang's own default is 128 new tokens
        "max_new_tokens": s.max_tokens if s.max_tokens is not None else default_max_tokens,
        "stop_token_ids": req.stop_token_ids,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if s.temperature is not None:
        sampling["temperature"] = s.temperature
    if s.top_p is not None:
        sampling["top_p"] = s.top_p
    if s.seed is not None:
        sampling["sampling_seed"] = s.seed
    if s.stop:
        sampling["stop"] = s.stop
    return {
        "input_ids": req.prompt_token_ids,
        "rid": req.request_id,
        "stream": True,
        "sampling_params": sampling,
    }


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
        if not self.ids:
            return out  # the first chunk reads the same either way
        if self.mode == "auto":
            self.mode = self._detect(out, completion, matched)
        return out[len(self.ids):] if self.mode == "cumulative" else out

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
            error = (
                error_for_status(status, message)
                if isinstance(status, int) and 400 <= status < 500
                else BusError(code=ErrorCode.ENGINE_ERROR, message=message)
            )
            return EngineChunk(token_ids=delta, finish_reason="error", usage=usage, error=error)
        matched = finish.get("matched") if isinstance(finish, dict) else None
        stop_id = matched if isinstance(matched, int) else None
        if stop_id is not None and (not self.ids or self.ids[-1] != stop_id):
            delta = [*delta, stop_id]  # trimmed by the server: make it part of the stream
            self.ids.append(stop_id)
        return EngineChunk(token_ids=delta, finish_reason="stop", stop_token_id=stop_id, usage=usage)


class SglangAdapter:
    kind = "sglang"

    def __init__(self, mode: Mode = "auto", default_max_tokens: int = 131072) -> None:
        self.mode: Mode = mode
        self.default_max_tokens = default_max_tokens

    def request(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        return "/generate", generate_body(req, self.default_max_tokens)

    def decoder(self, req: GenerateRequest) -> SglangDecoder:
        return SglangDecoder(self.mode)

    async def abort(
        self, client: httpx.AsyncClient, base_url: str, request_id: str, timeout: float
    ) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await client.post(f"{base_url}/abort_request", json={"rid": request_id}, timeout=timeout)
