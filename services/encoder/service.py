"""The encoder's work, independent of the bus wiring: a ``GenerateJob`` in, its prompt rendered,
a ``GenerateRequest`` forward to the dispatchers (or a ``GenerationFailed`` to the gateway).

Jobs run concurrently. Small prompts render inline (about a millisecond); large ones render in
a pool of processes, so one slow render never holds up the others, and the caller's deadline
bounds how long anyone waits for it. A job whose caller has given up (deadline passed, or a
``Cancel`` heard) is never started."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import functools
import logging
import multiprocessing
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry.trace import Span, SpanKind

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.encode import EncodeRequest, PromptContinuation
from contracts.messages.generate import EventFrame, GenerateJob, GenerateRequest, GenerationFailed, ParseSpec, Route
from contracts.messages.items import ConversationItem
from services.common import telemetry
from services.common.bus import Bus
from services.common.errors import ChorusError
from services.common.harmony import ASSISTANT_STOP_TOKENS, harmony_encoding
from services.common.infra import worker_dies_with_parent
from services.common.metrics import RENDERS
from services.common.recent import Recent
from services.common.tokens import conversation_chars
from services.encoder.continuations import PromptMemory, continued, redone, remembered, unusable
from services.encoder.render import EncodedPrompt, PastLimit, RenderError, selection_text, too_long
from services.encoder.renderer import Renderer
from services.encoder.settings import Settings

log = logging.getLogger("chorus.encoder")

COUNT_TIMEOUT_S = 30.0  # a token count renders the prompt, nothing more
T = TypeVar("T")


@functools.cache
def _renderer(cutoff: str) -> Renderer:
    return Renderer(harmony_encoding(), cutoff)


def _render(req: EncodeRequest, today: dt.date, cutoff: str, limit: int, reserve: int) -> EncodedPrompt:
    """Runs in a pool process (module level: picklable)."""
    return _renderer(cutoff).render(req, today, limit, reserve)


def _tail(
    items: list[ConversationItem], recipients: dict[str, str], cutoff: str, room: int
) -> tuple[list[int], dict[str, str]]:
    """A continuation's new items as tokens, and the calls known after them (runs in a pool
    process too: its arguments and result travel)."""
    return _renderer(cutoff).tail(items, recipients, room), recipients


def _warm(cutoff: str) -> None:
    _renderer(cutoff)


def prompt_chars(req: EncodeRequest) -> int:
    """About how many characters the prompt holds (deciding inline vs pool): the conversation,
    the instructions, and the tools and response format (descriptions and schemas are text to
    encode as well; serialised only when there are any: this is on every request's path)."""
    chars = len(req.instructions or "") + conversation_chars(req.items)
    if req.tools or req.namespaces or req.response_format is not None:
        chars += len(req.model_dump_json(include={"tools", "namespaces", "response_format"}))
    return chars


def context_error(prompt_tokens: int, max_tokens: int | None, context_length: int) -> BusError | None:
    """A prompt the model cannot take: the caller's mistake, found before any engine is called
    (the wording follows vLLM's)."""
    if prompt_tokens >= context_length:
        return BusError(
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            param="messages",
            message=(
                f"This model's maximum context length is {context_length} tokens. However, your "
                f"prompt has {prompt_tokens} tokens. Please reduce the length of the input."
            ),
        )
    if max_tokens is not None and prompt_tokens + max_tokens > context_length:
        return BusError(
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            param="max_tokens",
            message=(
                f"This model's maximum context length is {context_length} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                f"{max_tokens} for the output). Please reduce the length of the input or of the output."
            ),
        )
    return None


Forward = Callable[[GenerateRequest], Awaitable[None]]


class Encoder:
    """``forward`` takes each rendered request on to a dispatcher: by default a message to the
    dispatchers' queue group; a process that hosts a dispatcher as well hands it over in process
    while that dispatcher takes work (``services/worker``)."""

    def __init__(self, settings: Settings, bus: Bus, *, forward: Forward | None = None) -> None:
        self.settings = settings
        self.bus = bus
        self.forward: Forward = forward or self.publish
        self.in_flight = 0
        self._cancelled = Recent()  # generations cancelled lately
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._warming: list[concurrent.futures.Future[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.memory = PromptMemory(settings.remembered_prompt_tokens)
        self._idle = asyncio.Event()
        self._idle.set()

    def start_pool(self) -> None:
        if self.settings.render_processes > 0:
            # render processes die with the encoder, even when it is killed outright. Spawned,
            # not forked: a forked child would hold copies of this process's sockets (an
            # engine connection the dispatcher closes to abort a request stays open while a
            # render process has it) and of its threads' locks
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.settings.render_processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=worker_dies_with_parent,
            )
            self._warming = [
                self._pool.submit(_warm, self.settings.knowledge_cutoff) for _ in range(self.settings.render_processes)
            ]

    async def pool_warm(self, timeout: float) -> None:
        """Until the render processes have loaded the vocabulary (a second or so after start):
        a long prompt that arrived earlier would wait for it, after the stack said it was ready.
        A pool that fails to warm is left to fail its first render (logged here)."""
        if not self._warming:
            return
        done, pending = await asyncio.wait([asyncio.wrap_future(f) for f in self._warming], timeout=timeout)
        failed = [exc for f in done if (exc := f.exception()) is not None]
        if pending or failed:
            log.warning("the render processes did not start in %gs: %s", timeout, failed[0] if failed else "no answer")
        self._warming = []

    def close(self) -> None:
        if self._pool is not None:
            # waiting (for idle processes: a moment) leaves no pool thread behind for the
            # interpreter's exit to race with (an OSError traceback on Python 3.11)
            self._pool.shutdown(wait=True, cancel_futures=True)

    # handlers ---------------------------------------------------------------------------
    async def on_job(self, job: GenerateJob) -> None:
        """A small prompt is rendered here (about a millisecond: a task would only add a step
        to its time to first token); a large one in a task, so the subscription delivers the
        next job meanwhile."""
        pooled = self._pooled(job)
        self.in_flight += 1
        self._idle.clear()
        if not pooled:
            try:
                await self._run(job, pooled=False)
            finally:
                self._settle()
            return
        task = asyncio.get_running_loop().create_task(self._run(job, pooled=True))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._settle()
        if not task.cancelled() and (exc := task.exception()) is not None:  # _run answers for itself
            log.error("a render task failed", exc_info=exc)

    def _settle(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    def _pooled(self, job: GenerateJob) -> bool:
        """Whether ``job`` renders in the pool of processes (large prompts) or inline."""
        return self._pool is not None and prompt_chars(job.encode) >= self.settings.inline_render_chars

    async def on_cancel(self, msg: Cancel) -> None:
        self._cancelled.add(msg.generation_id)

    async def drain(self) -> None:
        await self._idle.wait()

    # the work ---------------------------------------------------------------------------
    def _given_up(self, job: GenerateJob) -> bool:
        return job.generation_id in self._cancelled or time.time() > job.deadline

    async def _run(self, job: GenerateJob, *, pooled: bool) -> None:
        if self._given_up(job):
            log.info("generation %s: given up before rendering; dropped", job.generation_id)
            return
        span = telemetry.child_span(
            "render",
            job.trace,
            SpanKind.CONSUMER,
            **{telemetry.GEN_AI_REQUEST_MODEL: job.encode.model, "chorus.generation_id": job.generation_id},
        )
        try:
            await self._encode(job, span, pooled)
        finally:
            span.end()

    async def _encode(self, job: GenerateJob, span: Span, pooled: bool) -> None:
        try:
            prompt = await self.render(job, pooled)
        except RenderError as exc:
            await self._fail(job, exc.error, span)
            return
        except TimeoutError:
            await self._fail(
                job,
                BusError(code=ErrorCode.TIMEOUT, message="rendering the prompt took longer than the request allows"),
                span,
            )
            return
        except Exception as exc:  # never leave the gateway without an answer
            log.exception("generation %s: rendering failed", job.generation_id)
            await self._fail(
                job,
                BusError(
                    code=ErrorCode.INTERNAL,
                    message="rendering the prompt failed",
                    retryable=isinstance(exc, concurrent.futures.BrokenExecutor),
                ),
                span,
            )
            return
        span.set_attribute("chorus.prompt_tokens", len(prompt.token_ids))
        span.set_attribute("chorus.render_ms", prompt.render_ms)
        if self._given_up(job):
            return
        too_long = context_error(len(prompt.token_ids), job.sampling.max_tokens, self.settings.context_length)
        if too_long is not None:
            await self._fail(job, too_long, span)
            return
        # built from validated parts: not validated again (the prompt's token ids alone take
        # 0.7 ms to validate at 30k tokens, on every request's way)
        request = GenerateRequest.model_construct(
            generation_id=job.generation_id,
            model=job.encode.model,
            prompt_token_ids=prompt.token_ids,
            stop_token_ids=prompt.stop_token_ids,
            resume_tokens=job.resume_tokens,
            sampling=job.sampling,
            selection_text=prompt.selection_text,
            parse=job.parse,
            route=job.route,
            deadline=job.deadline,
            render_ms=prompt.render_ms,
            trace=job.trace,
        )
        try:
            await self.forward(request)
        except ChorusError as exc:
            await self._fail(job, exc.error, span)

    async def count(self, encode: EncodeRequest) -> int:
        """The prompt tokens ``encode`` renders to (``RenderError`` for a caller's mistake)."""
        pooled = self._pool is not None and prompt_chars(encode) >= self.settings.inline_render_chars
        job = GenerateJob(
            generation_id="count",
            encode=encode,
            parse=ParseSpec(request_id="count"),
            route=Route(gateway="", parser=""),
            deadline=time.time() + COUNT_TIMEOUT_S,
        )
        return len((await self.render(job, pooled)).token_ids)

    async def publish(self, request: GenerateRequest) -> None:
        """``request`` to the dispatchers over the bus."""
        await self.bus.publish(self.bus.subjects.generate, request)

    async def render(self, job: GenerateJob, pooled: bool) -> EncodedPrompt:
        """The prompt of ``job`` (``pooled``: in a render process); ``RenderError`` for a caller's
        mistake, and for a continuation this encoder cannot use (``continuation_unknown``)."""
        enc = job.encode
        if enc.continues is not None:
            return await self._continue(job, enc.continues, pooled)
        today = dt.date.today()
        cutoff = self.settings.knowledge_cutoff
        reserve = job.sampling.max_tokens or 0  # room for the output when truncating
        args = (enc, today, cutoff, self.settings.context_length, reserve)
        prompt = await self._in_pool(job, _render, args) if pooled else _render(*args)
        RENDERS.labels("whole").inc()
        if enc.remember and enc.truncation == "disabled":
            self.memory.put(job.generation_id, remembered(enc, prompt, len(_renderer(cutoff).assistant)))
        return prompt

    async def _continue(self, job: GenerateJob, continues: PromptContinuation, pooled: bool) -> EncodedPrompt:
        """The prompt of a request carrying only the items after a remembered one."""
        t0 = time.perf_counter()
        enc = job.encode
        base = self.memory.get(continues.key)
        why = unusable(base, continues, enc)
        if why is not None or base is None:
            RENDERS.labels("unknown").inc()
            raise RenderError(BusError(code=ErrorCode.CONTINUATION_UNKNOWN, message=why or "", retryable=True))
        renderer = _renderer(self.settings.knowledge_cutoff)
        limit = self.settings.context_length
        kept, redo = redone(base, enc.items)
        if redo is not enc.items:  # a final answer: the open items again, with the new ones
            pooled = self._pool is not None and conversation_chars(redo) >= self.settings.inline_render_chars
        try:
            prefix = renderer.prefix(enc, dt.date.today(), limit, items=base.prefix_items)
            room = limit - len(prefix) - kept
            if room <= 0:
                raise PastLimit
            args = (redo, dict(base.recipients), self.settings.knowledge_cutoff, room)
            tail, recipients = await self._in_pool(job, _tail, args) if pooled else _tail(*args)
        except PastLimit:
            raise too_long(limit) from None
        RENDERS.labels("continued").inc()
        if enc.remember:
            self.memory.put(job.generation_id, continued(base, enc.items, kept, redo, tail, recipients))
        body = base.body if kept == len(base.body) else base.body[:kept]
        return EncodedPrompt(
            token_ids=[*prefix, *body, *tail, *renderer.assistant],
            stop_token_ids=list(ASSISTANT_STOP_TOKENS),
            selection_text=selection_text(enc.items) or base.selection,
            render_ms=(time.perf_counter() - t0) * 1000,
            prefix_len=len(prefix),
        )

    async def _in_pool(self, job: GenerateJob, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """``fn(*args)`` in a render process, within the job's deadline."""
        pool = self._pool
        assert pool is not None  # a job is pooled only when there is a pool
        loop = asyncio.get_running_loop()
        remaining = max(0.0, job.deadline - time.time())
        try:
            async with asyncio.timeout(remaining):
                return await loop.run_in_executor(pool, fn, *args)
        except concurrent.futures.BrokenExecutor:
            if self._pool is pool:  # a render process died: later renders get a new pool
                log.warning("the render pool broke; starting a new one")
                self.start_pool()
                pool.shutdown(wait=False, cancel_futures=True)
            raise

    async def _fail(self, job: GenerateJob, error: BusError, span: Span) -> None:
        telemetry.failed(span, error.code.value, error.message)
        failed = GenerationFailed(generation_id=job.generation_id, stage="encoder", error=error)
        await self.bus.publish(self.bus.subjects.gateway_events(job.route.gateway), EventFrame(events=[failed]))
