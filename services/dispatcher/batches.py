"""Turning one engine stream into the TokenBatch stream on the request's token subject.

One batch per engine chunk, as delivered (never per token), ``seq`` from 0; the last batch has
``done=True`` with finish_reason, stop token and usage, or an error. vLLM sends usage in a
chunk after the finish, so the finishing chunk is held until usage or the end of the stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import (
    EngineFinishReason,
    EngineUsage,
    GenerateRequest,
    TokenBatch,
)
from services.common.bus import headers_for
from services.dispatcher.engines.base import EngineChunk, usage_or_count
from services.dispatcher.engines.stream import EngineStream

# subject, payload, headers
Publish = Callable[[str, bytes, dict[str, str]], Awaitable[None]]

DRAIN_TIMEOUT_S = 1.0


class BatchWriter:
    """Publishes one request's TokenBatch messages in order; at most one final batch."""

    def __init__(self, publish: Publish, request: GenerateRequest) -> None:
        self._publish = publish
        self.request = request
        self.headers = headers_for(request.request_id)
        self.seq = 0
        self.completion_tokens = 0
        self.done = False

    async def _send(self, batch: TokenBatch) -> None:
        self.seq += 1
        await self._publish(self.request.token_subject, batch.model_dump_json().encode(), self.headers)

    async def tokens(self, token_ids: list[int]) -> None:
        if self.done or not token_ids:
            return
        self.completion_tokens += len(token_ids)
        await self._send(TokenBatch(request_id=self.request.request_id, seq=self.seq, token_ids=token_ids))

    async def final(
        self,
        finish_reason: EngineFinishReason,
        *,
        token_ids: list[int] | None = None,
        stop_token_id: int | None = None,
        usage: EngineUsage | None = None,
        error: BusError | None = None,
    ) -> None:
        if self.done:
            return
        self.done = True
        ids = token_ids or []
        self.completion_tokens += len(ids)
        await self._send(TokenBatch(
            request_id=self.request.request_id,
            seq=self.seq,
            token_ids=ids,
            done=True,
            finish_reason=finish_reason,
            stop_token_id=stop_token_id,
            usage=usage_or_count(usage, len(self.request.prompt_token_ids), self.completion_tokens),
            error=error,
        ))

    async def fail(self, error: BusError, token_ids: list[int] | None = None,
                   usage: EngineUsage | None = None) -> None:
        await self.final("error", token_ids=token_ids, usage=usage, error=error)


async def relay(stream: EngineStream, writer: BatchWriter) -> None:
    """Engine chunks -> TokenBatch messages, until the final batch is out. Then the rest of the
    engine stream is read briefly (``[DONE]``) so the connection can be reused."""
    held: EngineChunk | None = None
    usage: EngineUsage | None = None
    async with contextlib.aclosing(stream.chunks()) as chunks:
        async for chunk in chunks:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.error is not None:
                await writer.fail(chunk.error, chunk.token_ids, usage)
                return
            if held is None and chunk.finish_reason is None:
                await writer.tokens(chunk.token_ids)
                continue
            if held is None:
                held = chunk
            elif chunk.token_ids:  # tokens after the finish (unexpected): keep them
                held = EngineChunk([*held.token_ids, *chunk.token_ids], held.finish_reason,
                                   held.stop_token_id, held.usage)
            if usage is not None:
                break
        if held is None:
            await writer.fail(BusError(
                code=ErrorCode.ENGINE_ERROR,
                message=f"the engine stream from {stream.url} ended without a finish reason",
            ), usage=usage)
            return
        await writer.final(held.finish_reason or "stop", token_ids=held.token_ids,
                           stop_token_id=held.stop_token_id, usage=usage)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                async for _ in chunks:
                    pass
