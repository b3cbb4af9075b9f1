"""One Chat Completions request as a run (as ``responses/run.py``'s ``ResponseRun`` for the
Responses API): the generation it opens, the choice it accumulates, what it ends with, and
what it reports (metrics, span, access line). The routes only choose the transport: a whole
``ChatCompletion`` or SSE chunks."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import ResponseFormat
from contracts.messages.generate import ParseSpec
from services.common.telemetry import carrier_of
from services.gateway import structured
from services.gateway.chat.events import ChatState, ChunkWriter
from services.gateway.chat.items import offered_tools, response_format_of, to_encode_request, to_sampling
from services.gateway.chat.request import ChatRequest
from services.gateway.chat.response import completion
from services.gateway.context import GatewayContext
from services.gateway.errors import ABORTED
from services.gateway.generation import Generation, GenerationSpec
from services.gateway.observe import Observed


class ChatRun:
    def __init__(self, ctx: GatewayContext, body: ChatRequest, request: Request | None) -> None:
        self.ctx, self.body = ctx, body
        self.request_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.format: ResponseFormat | None = response_format_of(body)
        sampling = to_sampling(body, ctx.settings.default_max_tokens, self.format)
        names, schemas = offered_tools(body)
        self.observed = Observed.start(
            request,
            api="chat",
            model=body.model,
            request_id=self.request_id,
            stream=body.stream,
            max_tokens=sampling.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
        )
        self.spec = GenerationSpec(
            to_encode_request(body, self.format),
            sampling,
            ParseSpec(request_id=self.request_id, tool_names=names, tool_schemas=schemas),
            trace=carrier_of(self.observed.span),
        )
        self.state = ChatState()
        self.generation: Generation | None = None

    # -- the run ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Generation]:
        """The generation, started (set-up failures raise here, before anything is answered);
        leaving closes it (the engine is aborted if it still runs)."""
        async with self.ctx.generations.open(self.spec) as generation:
            self.generation = generation
            yield generation

    async def deltas(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The choice's deltas, a list per parser batch (possibly empty: a batch may only end
        an item), while the opened generation runs."""
        assert self.generation is not None, "opened() first"
        async for batch in self.generation.batches():
            deltas = self.state.apply(batch)
            if deltas:
                self.observed.first_output()  # once the first output is on its way
            yield deltas

    async def drain(self) -> None:
        async for _ in self.deltas():
            pass

    def failure(self) -> BusError | None:
        """What the run failed with, if it did: the generation's failure, an engine that
        aborted it, or an answer that breaks ``response_format`` (the grammar should have
        made it conform)."""
        state = self.state
        if state.failed is not None:
            return state.failed.error
        if state.aborted:
            return ABORTED
        if self.format is None or state.tools or state.finish_reason != "stop":
            return None
        why = structured.check(state.text, self.format)
        return (
            None
            if why is None
            else BusError(
                code=ErrorCode.ENGINE_ERROR, message=f"The model's answer did not follow response_format: {why}"
            )
        )

    def finish(self, failure: BusError | None) -> None:
        """Report the run's end (metrics, span, access line)."""
        state = self.state
        accepted = self.generation.accepted if self.generation is not None else None
        worker = accepted.worker if accepted is not None else None
        usage = state.finished.usage if state.finished else None
        if failure is not None:
            self.observed.finish(outcome="failed", usage=usage, worker=worker, error=failure.message)
        else:
            reason = state.finish_reason
            self.observed.finish(outcome=reason, usage=usage, finish_reasons=[reason], worker=worker)

    # -- what it answers ----------------------------------------------------------------------
    def completion(self) -> bytes:
        return (
            completion(self.state, self.request_id, self.body.model, self.created)
            .model_dump_json(exclude_unset=True)
            .encode()
        )

    def chunks(self) -> ChunkWriter:
        include_usage = bool(self.body.stream_options and self.body.stream_options.include_usage)
        return ChunkWriter(
            {
                "id": self.request_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.body.model,
                "system_fingerprint": None,
            },
            include_usage=include_usage,
        )

    def server_timing(self) -> dict[str, str]:
        """How long set-up took: prompt rendering, and everything until an engine took it."""
        generation = self.generation
        accepted = generation.accepted if generation is not None else None
        render = accepted.render_ms if accepted is not None else 0.0
        accept = generation.accept_ms if generation is not None else 0.0
        return {"Server-Timing": f"render;dur={render:.3f}, accept;dur={accept:.3f}"}
