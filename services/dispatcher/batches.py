"""One generation's engine stream as TokenBatch messages for its parser worker.

The first batch opens the parser's session (the parse spec, the owning gateway) and carries
the tokens an earlier attempt produced, so the parser rebuilds its state from them. Then one
batch per engine read (everything that had arrived), never one per token; the outbox merges
what piles up while the dispatcher is busy. The last batch has ``done=True`` with the finish
reason, stop token and usage (counted over the whole output, earlier attempts included), or an
error. vLLM sends usage in a chunk after the finish, so the finishing chunk is held until usage
arrives or the stream ends."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import EngineFinishReason, EngineUsage, GenerateRequest, TokenBatch
from services.dispatcher.engines.base import EngineChunk
from services.dispatcher.engines.stream import EngineStream

DRAIN_TIMEOUT_S = 1.0
URGENT_TOKENS = 16  # a message header and the first words of its content


class BatchWriter:
    """Puts one generation's batches, in order, into its parser's outbox; one final batch."""

    def __init__(self, put: Callable[[TokenBatch, bool], None], request: GenerateRequest) -> None:
        self._put = put
        self.request = request
        self._id = request.generation_id
        # a generation's first tokens hold its time to first token: they go out at once
        self._urgent_below = len(request.resume_tokens) + URGENT_TOKENS
        self.offset = 0  # tokens sent so far, resumed ones included
        self.done = False
        self.opened = False

    @property
    def urgent(self) -> bool:
        """Still sending the first tokens, which go out at once."""
        return self.offset < self._urgent_below

    def open(self) -> None:
        """The session's first batch: spec, owner, trace and the resumed tokens."""
        if self.opened:
            return
        self.opened = True
        req = self.request
        self._put(
            TokenBatch(
                generation_id=req.generation_id,
                offset=0,
                token_ids=list(req.resume_tokens),
                open=req.parse,
                gateway=req.route.gateway,
                trace=req.trace,
            ),
            True,
        )
        self.offset = len(req.resume_tokens)

    def tokens(self, token_ids: list[int]) -> None:
        if self.done or not token_ids:
            return
        offset = self.offset
        self._put(TokenBatch(generation_id=self._id, offset=offset, token_ids=token_ids), offset < self._urgent_below)
        self.offset = offset + len(token_ids)

    def final(
        self,
        finish_reason: EngineFinishReason,
        *,
        token_ids: list[int] | None = None,
        stop_token_id: int | None = None,
        stop_text: str | None = None,
        usage: EngineUsage | None = None,
        error: BusError | None = None,
    ) -> None:
        if self.done:
            return
        self.done = True
        ids = token_ids or []
        self._put(
            TokenBatch(
                generation_id=self.request.generation_id,
                offset=self.offset,
                token_ids=ids,
                done=True,
                finish_reason=finish_reason,
                stop_token_id=stop_token_id,
                stop_text=stop_text,
                usage=self._usage(usage, self.offset + len(ids)),
                error=error,
            ),
            True,
        )
        self.offset += len(ids)

    def fail(self, error: BusError, token_ids: list[int] | None = None, usage: EngineUsage | None = None) -> None:
        self.final("error", token_ids=token_ids, usage=usage, error=error)

    def _usage(self, engine: EngineUsage | None, output_tokens: int) -> EngineUsage:
        """Usage of the whole output: the engine counted the resumed tokens as prompt."""
        resumed = len(self.request.resume_tokens)
        prompt = len(self.request.prompt_token_ids)
        if engine is None:
            return EngineUsage(prompt_tokens=prompt, completion_tokens=output_tokens)
        return EngineUsage(
            prompt_tokens=max(0, engine.prompt_tokens - resumed) if engine.prompt_tokens else prompt,
            completion_tokens=engine.completion_tokens + resumed,
            cached_tokens=engine.cached_tokens,
        )


def merge(batches: list[TokenBatch]) -> list[TokenBatch]:
    """Batches of the same generation that piled up, merged into one (order kept)."""
    if len(batches) < 2:
        return batches
    out: dict[str, TokenBatch] = {}
    for batch in batches:
        held = out.get(batch.generation_id)
        if held is None or held.done:
            out[batch.generation_id] = batch
            continue
        out[batch.generation_id] = TokenBatch(
            generation_id=held.generation_id,
            offset=held.offset,
            token_ids=[*held.token_ids, *batch.token_ids],
            open=held.open,
            gateway=held.gateway,
            trace=held.trace,
            done=batch.done,
            finish_reason=batch.finish_reason,
            stop_token_id=batch.stop_token_id,
            stop_text=batch.stop_text,
            usage=batch.usage,
            error=batch.error,
        )
    return list(out.values())


class Relay:
    """Engine chunks -> batches, one engine read at a time (called synchronously by the
    stream as reads arrive): the tokens of a read go out as one batch; the finishing chunk is
    held until usage arrives or the stream ends; an error chunk ends with an error batch."""

    def __init__(self, writer: BatchWriter) -> None:
        self.writer = writer
        self.held: EngineChunk | None = None
        self.usage: EngineUsage | None = None
        self.failed = False

    def read(self, chunks: list[EngineChunk]) -> bool:
        """One engine read; True once the final batch is out."""
        writer = self.writer
        held = self.held
        ids: list[int] = []
        for chunk in chunks:
            if chunk.usage is not None:
                self.usage = chunk.usage
            if chunk.error is not None:
                if held is None:
                    writer.tokens(ids)
                    writer.fail(chunk.error, chunk.token_ids, self.usage)
                    self.failed = True
                    return True
                break  # broke while the usage was still to come
            if held is None and chunk.finish_reason is None:
                ids.extend(chunk.token_ids)
            elif held is None:
                held = chunk
            elif chunk.token_ids:  # tokens after the finish (unexpected): keep them
                held = dataclasses.replace(held, token_ids=[*held.token_ids, *chunk.token_ids])
        self.held = held
        writer.tokens(ids)
        if held is not None and self.usage is not None:
            self.end()
            return True
        return False

    def end(self) -> None:
        """The stream is over: the final batch, unless it is out already."""
        if self.writer.done:
            return
        held = self.held
        if held is None:
            self.failed = True
            self.writer.fail(
                BusError(code=ErrorCode.ENGINE_ERROR, message="the engine stream ended without a finish reason"),
                usage=self.usage,
            )
            return
        self.writer.final(
            held.finish_reason or "stop",
            token_ids=held.token_ids,
            stop_token_id=held.stop_token_id,
            stop_text=held.stop_text,
            usage=self.usage,
        )


async def relay(stream: EngineStream, writer: BatchWriter, window: Callable[[], float] | None = None) -> None:
    """Engine chunks -> batches, until the final batch is out. Then the rest of the engine
    answer is awaited briefly (``[DONE]``) so the connection can be reused. Past its first
    tokens, the engine's socket is read at most once per ``window()`` (a busy dispatcher reads
    many events at a time; the tokens would wait that long in the outbox anyway)."""
    state = Relay(writer)
    pace = None if window is None else (lambda: 0.0 if writer.urgent else window())
    stream.start(state.read, pace)
    await stream.ended
    state.end()
    if not state.failed:
        await stream.drain(DRAIN_TIMEOUT_S)
