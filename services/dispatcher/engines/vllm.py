"""vLLM: ``POST /v1/completions`` with a token-id prompt, token ids back (``return_token_ids``).

Each stream chunk's ``choices[0].token_ids`` is a delta that includes the stop token;
``stop_reason`` is the matched stop id (null when the model's EOS ended it); with
``include_usage`` a last chunk carries ``usage`` and no choices. Closing the connection aborts
the request in vLLM, so ``abort`` has nothing more to do."""

from __future__ import annotations

from typing import Any

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import EngineFinishReason, EngineUsage, GenerateRequest
from services.dispatcher.engines.base import EngineChunk, engine_prompt, max_new_tokens, sampling_fields, token_ids
from services.dispatcher.engines.constraints import vllm_structured_outputs
from services.dispatcher.engines.http import EngineHttp

FINISH_REASONS: dict[str, EngineFinishReason] = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}
# ids that end a gpt-oss generation without vLLM naming them in stop_reason (EOS)
EOS_IDS = frozenset({200002, 199999})


def completion_body(req: GenerateRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": req.model,
        "prompt": engine_prompt(req),
        # null: all the room left in the context (vLLM's /v1/completions default would be 16)
        "max_tokens": max_new_tokens(req),
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": req.stop_token_ids,
        "request_id": req.generation_id,
    }
    body.update(sampling_fields(req.sampling))
    if (structured := vllm_structured_outputs(req)) is not None:
        body["structured_outputs"] = structured
    return body


def _usage(raw: dict[str, Any]) -> EngineUsage:
    details = raw.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return EngineUsage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        cached_tokens=cached if isinstance(cached, int) else None,
    )


class VllmDecoder:
    def __init__(self, stop_token_ids: list[int]) -> None:
        self.stops = frozenset(stop_token_ids) | EOS_IDS
        self.last_id: int | None = None

    def feed(self, event: dict[str, Any]) -> EngineChunk | None:
        raw_usage = event.get("usage")
        usage = _usage(raw_usage) if isinstance(raw_usage, dict) else None
        choices = event.get("choices") or []
        if not choices:
            return EngineChunk(usage=usage) if usage else None
        choice = choices[0]
        ids = choice.get("token_ids")
        if ids is None:
            if choice.get("text") or choice.get("finish_reason") is None:
                return EngineChunk(
                    error=BusError(
                        code=ErrorCode.ENGINE_ERROR,
                        message="the vLLM server sent no token_ids: it needs return_token_ids support (vLLM >= 0.10.2)",
                    )
                )
            ids = []
        ids = token_ids(ids)
        if ids:
            self.last_id = ids[-1]
        raw_finish = choice.get("finish_reason")
        if raw_finish is None:
            return EngineChunk(token_ids=ids, usage=usage)
        finish = FINISH_REASONS.get(str(raw_finish), "stop")
        stop_id = None
        stop_text = None
        if finish == "stop":
            reason = choice.get("stop_reason")
            if isinstance(reason, str):  # a stop string matched (the text is trimmed, not the ids)
                stop_text = reason
            elif isinstance(reason, int):
                stop_id = reason
                if self.last_id != reason:  # make the stop token part of the stream, always
                    ids.append(reason)
                    self.last_id = reason
            elif self.last_id in self.stops:
                stop_id = self.last_id
        return EngineChunk(token_ids=ids, finish_reason=finish, stop_token_id=stop_id, usage=usage, stop_text=stop_text)


class VllmAdapter:
    kind = "vllm"
    resumable = True

    def request(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        return "/v1/completions", completion_body(req)

    def decoder(self, req: GenerateRequest) -> VllmDecoder:
        return VllmDecoder(req.stop_token_ids)

    async def abort(self, http: EngineHttp, base_url: str, request_id: str, timeout: float) -> None:
        """Closing the HTTP stream is vLLM's abort."""
