"""Text mode: an OpenAI-compatible upstream that streams text, not token ids (an engine started
without a reasoning parser, a hosted provider, llama.cpp).

``openai=URL`` calls ``/v1/completions`` with the rendered Harmony prompt as text;
``openai-chat=URL`` calls ``/v1/chat/completions`` with the prompt's messages. Either way the
streamed text (raw Harmony, ``<think>`` tags or plain) and any pre-parsed chat deltas
(``reasoning_content`` or ``reasoning``, ``content``, ``tool_calls``) become Harmony token ids
(services.common.textstream), so the parser treats the upstream like any engine. A chunk's delta
is always consumed before its finish_reason."""

from __future__ import annotations

from typing import Any

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import EngineUsage, GenerateRequest
from services.common.harmony import CALL, RETURN, harmony_encoding
from services.dispatcher.engines.base import EngineChunk, error_message, sampling_fields
from services.dispatcher.engines.http import EngineHttp
from services.dispatcher.textstream import Finish, TextToHarmonyTokens, prompt_messages


def _usage(raw: Any) -> EngineUsage | None:
    if not isinstance(raw, dict):
        return None
    return EngineUsage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0), completion_tokens=int(raw.get("completion_tokens") or 0)
    )


class OpenAITextDecoder:
    def __init__(self) -> None:
        self.tokens = TextToHarmonyTokens(harmony_encoding())

    def feed(self, event: dict[str, Any]) -> EngineChunk | None:
        if "error" in event:
            return EngineChunk(
                error=BusError(code=ErrorCode.ENGINE_ERROR, message=error_message(event, "the upstream failed"))
            )
        usage = _usage(event.get("usage"))
        choices = event.get("choices") or []
        if not choices:
            return EngineChunk(usage=usage) if usage else None
        choice = choices[0]
        ids: list[int] = []
        if "text" in choice:  # /v1/completions
            ids += self.tokens.text(choice.get("text") or "")
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            ids += self.tokens.reasoning(reasoning)
        if delta.get("content"):
            ids += self.tokens.content(delta["content"])
        for call in delta.get("tool_calls") or []:
            ids += self.tokens.tool_call(call)
        raw_finish = choice.get("finish_reason")
        if raw_finish is None:
            return EngineChunk(token_ids=ids, usage=usage) if ids or usage else None
        finish: Finish = "length" if raw_finish == "length" else "stop"
        ids += self.tokens.finish(finish)
        stop_id = ids[-1] if ids and ids[-1] in (RETURN, CALL) else None
        return EngineChunk(token_ids=ids, finish_reason=finish, stop_token_id=stop_id, usage=usage)


class OpenAITextAdapter:
    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.kind = "openai-chat" if chat else "openai"
        # the upstream's text is converted as a fresh output: a cut-off one cannot be continued
        self.resumable = False

    def request(self, req: GenerateRequest) -> tuple[str, dict[str, Any]]:
        s = req.sampling
        enc = harmony_encoding()
        body: dict[str, Any] = {"model": req.model, "stream": True, "stream_options": {"include_usage": True}}
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        body.update(sampling_fields(s))
        if self.chat:
            body["messages"] = prompt_messages(req.prompt_token_ids, enc)
            return "/v1/chat/completions", body
        body["prompt"] = enc.decode(req.prompt_token_ids)
        body["skip_special_tokens"] = False  # vLLM honours it; others ignore it
        return "/v1/completions", body

    def decoder(self, req: GenerateRequest) -> OpenAITextDecoder:
        return OpenAITextDecoder()

    async def abort(self, http: EngineHttp, base_url: str, request_id: str, timeout: float) -> None:
        """Closing the HTTP stream is the abort."""
