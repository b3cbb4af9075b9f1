"""One Anthropic Messages request as a run (as ``chat/run.py``'s ``ChatRun``): the generation
it opens (the same ``Generation`` every API drives: resumption, cancellation on disconnect),
the answer it accumulates (``events.MessageStream``), what it ends with, and what it reports
(metrics, span, access line, with ``api="messages"``). The routes only choose the transport."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import ParseSpec
from services.common.telemetry import carrier_of
from services.gateway import structured
from services.gateway.context import GatewayContext
from services.gateway.errors import ABORTED
from services.gateway.generation import Generation, GenerationSpec
from services.gateway.messages.events import MessageStream
from services.gateway.messages.items import offered_tools, response_format_of, to_encode_request, to_sampling
from services.gateway.messages.request import MessagesRequest, thinking_kept, thinking_shown
from services.gateway.observe import Observed


class MessagesRun:
    def __init__(self, ctx: GatewayContext, body: MessagesRequest, request: Request | None) -> None:
        self.ctx, self.body = ctx, body
        self.served = ctx.served_model(body.model)
        self.message_id = f"msg_{uuid.uuid4().hex}"
        sealer = ctx.sealer
        self.stream = MessageStream(
            body.model, self.message_id, sealer.seal, thinking_shown(body), keep_thinking=thinking_kept(body)
        )
        self.format = response_format_of(body)
        encode = to_encode_request(body, unseal=sealer.open).model_copy(update={"model": self.served})
        sampling = to_sampling(body, ctx.settings.default_max_tokens)
        names, schemas = offered_tools(body)
        self.observed = Observed.start(
            request,
            api="messages",
            model=self.served,
            request_id=self.message_id,
            stream=body.stream,
            max_tokens=sampling.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
        )
        self.spec = GenerationSpec(
            encode,
            sampling,
            ParseSpec(request_id=self.message_id, tool_names=names, tool_schemas=schemas),
            trace=carrier_of(self.observed.span),
        )
        self.generation: Generation | None = None

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Generation]:
        """The generation, started (set-up failures raise here, before anything is answered);
        leaving closes it (the engine is aborted if it still runs)."""
        async with self.ctx.generations.open(self.spec) as generation:
            self.generation = generation
            yield generation

    def start(self) -> bytes:
        """``message_start`` (with the prompt's tokens, known once an engine took it) and a ping."""
        accepted = self.generation.accepted if self.generation is not None else None
        return self.stream.start(accepted.prompt_tokens if accepted is not None else 0) + self.stream.ping()

    async def events(self) -> AsyncIterator[bytes]:
        """The answer's SSE events, a chunk per parser batch (empty ones left out)."""
        assert self.generation is not None, "opened() first"
        async for batch in self.generation.batches():
            out = self.stream.apply(batch)
            if out:
                self.observed.first_output()
                yield out

    async def drain(self) -> None:
        async for _ in self.events():
            pass

    def failure(self) -> BusError | None:
        """What the run failed with, if it did: the generation's failure, an engine that aborted
        it (a cut-off answer never looks complete), or an answer that breaks the requested
        format."""
        stream = self.stream
        if stream.failed is not None:
            return stream.failed.error
        if stream.aborted:
            return ABORTED
        if self.format is None or stream.called or stream.stop_reason != "end_turn":
            return None
        answer = "".join(b.text for b in stream.blocks if b.kind == "text")
        why = structured.check(answer, self.format)
        if why is None:
            return None
        return BusError(code=ErrorCode.ENGINE_ERROR, message=f"The model's answer did not follow the format: {why}")

    def finish(self, failure: BusError | None) -> None:
        """Report the run's end (metrics, span, access line)."""
        accepted = self.generation.accepted if self.generation is not None else None
        worker = accepted.worker if accepted is not None else None
        usage = self.stream.usage
        if failure is not None:
            self.observed.finish(outcome="failed", usage=usage, worker=worker, error=failure.message)
        else:
            reason = self.stream.stop_reason
            self.observed.finish(outcome=reason, usage=usage, finish_reasons=[reason], worker=worker)
