"""One model generation, seen from the gateway that owns it.

    async with generations.open(spec) as generation:   # ChorusError: failed before starting
        async for events in generation.batches():
            ...

(``generations.py``: the gateway's generations, which send the jobs and route the events.)
The gateway sends one ``GenerateJob`` and reads the typed events that come back (from the
encoder or dispatcher when it cannot start, then from the parser). It survives any single
death on the path: when the parser or dispatcher serving it dies (heartbeats stop), when the
engine breaks mid-stream (a retryable failure), or when the NATS connection was lost, it
starts a new attempt with the output tokens parsed so far (``resume_tokens``): the engine
continues the same output, a fresh parser session replays it, and ``Delivered`` drops what the
caller already has, so the caller sees one stream. Leaving the context early (the client is
gone) always cancels the current attempt: the engine request is aborted."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import TypeAdapter

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import EncodeRequest, PromptContinuation
from contracts.messages.generate import (
    EventFrame,
    GenerateJob,
    GenerationAccepted,
    GenerationFailed,
    ParsedBatch,
    ParseSpec,
    Route,
    SamplingParams,
)
from contracts.messages.items import ConversationItem
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent
from services.common.errors import ChorusError
from services.common.metrics import BUS_HOP, RESUMES
from services.common.telemetry import inject

log = logging.getLogger("chorus.gateway.generation")

EVENTS: TypeAdapter[EventFrame] = TypeAdapter(EventFrame)


@dataclass(frozen=True)
class GenerationSpec:
    """What to generate: the conversation, the sampling, how to parse it (and the trace the
    services continue)."""

    encode: EncodeRequest
    sampling: SamplingParams
    parse: ParseSpec
    trace: dict[str, str] | None = None
    after: RenderedPrompt | None = None  # a prompt this one continues (its worker remembers it)


@dataclass(frozen=True)
class RenderedPrompt:
    """A generation's prompt as a worker rendered and remembered it (``EncodeRequest.remember``):
    a later generation whose conversation starts with the same ``items`` (the same objects)
    sends that worker only the items after them."""

    worker: str  # the Chorus worker process whose encoder has it
    key: str  # the generation id it was rendered for
    items: list[ConversationItem]

    def continued_by(self, encode: EncodeRequest) -> EncodeRequest | None:
        """``encode`` as a continuation of this prompt (None: it does not start with its items)."""
        n = len(self.items)
        if len(encode.items) < n or any(a is not b for a, b in zip(self.items, encode.items, strict=False)):
            return None
        return encode.model_copy(
            update={"items": encode.items[n:], "continues": PromptContinuation(key=self.key, length=n)}
        )


@dataclass(frozen=True)
class Replayed:
    """A generation continuing one that another process had started: the tokens parsed so far
    and the parse events already delivered for them."""

    tokens: list[int]
    events: list[ParseEvent]


@dataclass
class Interrupted:
    """The attempt cannot finish (its parser or dispatcher died, the bus was cut)."""

    generation_id: str
    reason: str


Incoming = GenerationAccepted | GenerationFailed | ParsedBatch | Interrupted


class Delivered:
    """What the caller has been given, so a resumed attempt's replay adds only what is new.

    Events are a deterministic function of the output tokens, so an attempt that replays the
    same tokens produces the same items and texts (batch boundaries may differ): per output
    index, an item is announced once, finished once, and its text grows only past what was
    delivered."""

    def __init__(self) -> None:
        self.added: set[int] = set()
        self.done: set[int] = set()
        self.chars: dict[int, int] = {}  # text delivered per item
        self._replayed: dict[int, int] = {}  # text seen per item in the current attempt

    def new_attempt(self) -> None:
        self._replayed = {}

    def filter(self, events: list[ParseEvent]) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        for event in events:
            if isinstance(event, ItemAdded):
                if event.output_index not in self.added:
                    self.added.add(event.output_index)
                    out.append(event)
            elif isinstance(event, ItemDelta):
                i = event.output_index
                start = self._replayed.get(i, 0)
                end = self._replayed[i] = start + len(event.delta)
                have = self.chars.get(i, 0)
                if end > have:
                    out.append(event if start >= have else ItemDelta(output_index=i, delta=event.delta[have - start :]))
                    self.chars[i] = end
            elif isinstance(event, ItemDone):
                if event.output_index not in self.done:
                    self.done.add(event.output_index)
                    out.append(event)
            else:
                out.append(event)
        return out


def resume_reason(reason: str) -> str:
    """Why a generation was resumed, as a metric label with bounded values."""
    for kind in ("parser", "dispatcher", "encoder", "engine"):
        if kind in reason:
            return kind
    return "timeout" if "no answer" in reason else "other"


def cut_short(events: list[ParseEvent], failure: Failed) -> list[ParseEvent]:
    """The batch of an attempt that failed and will be resumed, without the failure and without
    the items its parser closed because of it (``incomplete``): they are not done, the next
    attempt continues them."""
    return [
        e
        for e in events
        if e is not failure and not (isinstance(e, ItemDone) and getattr(e.item, "status", None) == "incomplete")
    ]


class Owner(Protocol):
    """What a generation needs of the gateway's ``Generations`` (``generations.py``)."""

    accept_timeout: float
    max_resumes: int

    async def submit(self, generation: Generation) -> None: ...
    async def cancel(self, generation_id: str, reason: str = ...) -> None: ...


@dataclass
class Generation:
    """A logical generation across its attempts."""

    spec: GenerationSpec
    owner: Owner
    first_timeout: float
    idle_timeout: float
    attempt: int = 0
    generation_id: str = ""
    parser: str = ""
    sent_to: str = ""  # the Chorus worker process the attempt's job went to ("": the encoders' group)
    accepted: GenerationAccepted | None = None
    tokens: list[int] = field(default_factory=list)  # output tokens parsed so far
    finished: bool = False
    resumes: int = 0
    started: float = field(default_factory=time.monotonic)
    accept_ms: float = 0.0  # from the first job to an engine taking it
    waiting_since: float = 0.0  # when the consumer started waiting for the next item
    wait_limit: float = 0.0  # how long it waits (0: not waiting)
    _inbox: deque[Incoming] = field(default_factory=deque)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    delivered: Delivered = field(default_factory=Delivered)
    salt: str = ""  # makes the ids of a generation taken over from another owner its own
    whole: bool = False  # the worker did not have the prompt this one continues: send it all
    _pending: list[ParsedBatch] = field(default_factory=list)  # arrived before accept

    @property
    def request_id(self) -> str:
        return self.spec.parse.request_id

    @property
    def dispatcher(self) -> str:
        return self.accepted.dispatcher if self.accepted is not None else ""

    def deliver(self, item: Incoming) -> None:
        self._inbox.append(item)
        self._arrived.set()

    # starting ---------------------------------------------------------------------------
    async def begin(self) -> None:
        """Send the first attempt and wait until an engine took it; a failure before then is
        raised as a ``ChorusError`` (the HTTP layer still answers with a status code)."""
        await self.owner.submit(self)
        while self.accepted is None:
            item = await self._next(self.owner.accept_timeout)
            if isinstance(item, GenerationAccepted):
                self.accepted = item
            elif isinstance(item, ParsedBatch):  # the parser was faster than the accept
                self._pending.append(item)
                self.accepted = GenerationAccepted(
                    generation_id=self.generation_id, dispatcher="", worker="", engine=""
                )
            elif isinstance(item, GenerationFailed) and item.error.code == ErrorCode.CONTINUATION_UNKNOWN:
                log.info("request %s: the whole conversation after all (%s)", self.request_id, item.error.message)
                self.whole = True
                self.attempt += 1
                await self.owner.submit(self)
            elif isinstance(item, GenerationFailed):
                if not item.error.retryable or not await self._resume(item.error.message):
                    raise ChorusError.of(item.error)
            elif isinstance(item, Interrupted) and not await self._resume(item.reason):
                raise ChorusError.of(BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message=item.reason))
        self.accept_ms = (time.monotonic() - self.started) * 1000
        BUS_HOP.labels("accepted").observe(self.accept_ms / 1000)

    async def _next(self, timeout: float) -> Incoming:
        """The next item of the current attempt (those of abandoned attempts are skipped). The
        owner's watchdog delivers ``Interrupted`` when nothing came for ``timeout`` seconds
        (no timer per wait: this is on every token's path)."""
        self.waiting_since, self.wait_limit = time.monotonic(), timeout
        while True:
            while not self._inbox:
                self._arrived.clear()
                await self._arrived.wait()
            item = self._inbox.popleft()
            if item.generation_id == self.generation_id:
                self.wait_limit = 0.0
                return item

    def _more(self) -> ParsedBatch | None:
        """A parsed batch of the current attempt that is already waiting, if the next item is one."""
        while self._inbox:
            item = self._inbox[0]
            if item.generation_id == self.generation_id and not isinstance(item, ParsedBatch):
                return None
            self._inbox.popleft()
            if item.generation_id == self.generation_id:
                return item  # type: ignore[return-value]
        return None

    async def _resume(self, reason: str) -> bool:
        """Start the next attempt from the tokens parsed so far; False when out of attempts."""
        if self.resumes >= self.owner.max_resumes:
            log.warning("request %s: not resuming again (%d resumes): %s", self.request_id, self.resumes, reason)
            return False
        self.resumes += 1
        RESUMES.labels(resume_reason(reason)).inc()
        log.warning(
            "request %s: resuming from %d output tokens (attempt %d): %s",
            self.request_id,
            len(self.tokens),
            self.attempt + 1,
            reason,
        )
        await self.owner.cancel(self.generation_id, "resumed")
        self.attempt += 1
        self.accepted = None
        self.delivered.new_attempt()
        self._pending.clear()
        try:
            await self.owner.submit(self)
        except ChorusError as exc:
            log.warning("request %s: resuming failed: %s", self.request_id, exc.error.message)
            return False
        return True

    # streaming --------------------------------------------------------------------------
    async def batches(self) -> AsyncIterator[list[ParseEvent]]:
        """Parser events, one list per parser batch, until (and including) ``Finished`` or
        ``Failed``; resumed attempts are invisible apart from a pause."""
        for early in self._pending:
            if taken := self._take(early):
                yield taken
        self._pending.clear()
        timeout = self.first_timeout
        while not self.finished:
            item = await self._next(timeout)
            failure: str | None = None
            if isinstance(item, ParsedBatch):
                # the generation's first batch: how long it took, noted once its events are out
                first = time.monotonic() - self.started if not self.tokens and self.attempt == 0 else None
                timeout = self.idle_timeout
                events: list[ParseEvent] = []
                batch: ParsedBatch | None = item
                while batch is not None:  # everything already waiting goes out together
                    retryable = next((e for e in batch.events if isinstance(e, Failed) and e.error.retryable), None)
                    if retryable is not None:  # the attempt is cut here and resumed
                        batch = batch.model_copy(update={"events": cut_short(batch.events, retryable)})
                        failure = retryable.error.message
                    events += self._take(batch)
                    batch = None if failure or self.finished else self._more()
                if events:
                    yield events
                if first is not None:
                    BUS_HOP.labels("first_batch").observe(first)
            elif isinstance(item, GenerationAccepted):
                self.accepted = item
            elif isinstance(item, GenerationFailed):
                if not item.error.retryable:
                    self.finished = True
                    yield [Failed(error=item.error)]
                    return
                self.whole = self.whole or item.error.code == ErrorCode.CONTINUATION_UNKNOWN
                failure = item.error.message
            else:
                failure = item.reason
            if failure is not None and not self.finished and not await self._resume(failure):
                self.finished = True
                yield [Failed(error=BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message=failure))]

    def _take(self, batch: ParsedBatch) -> list[ParseEvent]:
        """A batch of the current attempt: remember its tokens, pass on what is new. (A
        resumed attempt replays the known tokens first: only what lies past them is new.)"""
        known = len(self.tokens)
        if batch.offset <= known < batch.offset + len(batch.token_ids):
            self.tokens.extend(batch.token_ids[known - batch.offset :])
        if any(isinstance(e, Finished | Failed) for e in batch.events):
            self.finished = True
        return self.delivered.filter(list(batch.events))

    def job(self, gateway: str) -> GenerateJob:
        # the engine sees the API request id (a later turn or attempt adds its numbers)
        turn, attempt = self.spec.parse.turn, self.attempt
        self.generation_id = (
            self.request_id
            if turn == attempt == 0 and not self.salt
            else f"{self.request_id}.{turn}.{attempt}{self.salt}"
        )
        return GenerateJob(
            generation_id=self.generation_id,
            encode=self._encode(),
            sampling=self.spec.sampling,
            parse=self.spec.parse,
            route=Route(gateway=gateway, parser=self.parser),
            deadline=time.time() + self.owner.accept_timeout,
            resume_tokens=list(self.tokens),
            trace=self.spec.trace if self.spec.trace is not None else inject({}),
        )

    def _encode(self) -> EncodeRequest:
        """The conversation as this attempt sends it: only what follows the prompt it continues
        when its worker remembers that prompt."""
        encode, after = self.spec.encode, self.spec.after
        if after is None or self.whole or self.sent_to != after.worker:
            return encode
        return after.continued_by(encode) or encode

    @property
    def rendered(self) -> RenderedPrompt | None:
        """This generation's prompt, as its worker remembers it (asked with ``remember``)."""
        if not self.spec.encode.remember or not self.sent_to or self.accepted is None:
            return None
        return RenderedPrompt(self.sent_to, self.generation_id, self.spec.encode.items)
