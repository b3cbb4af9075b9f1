"""Test helpers for services on a real NATS: run a service in this event loop, and tap the
subjects it sends to (decoded with the contracts)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, TypeAdapter

from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import GenerateJob, GenerateRequest, ParseSpec, Route, SamplingParams
from contracts.messages.items import MessageItem
from contracts.subjects import Subjects
from services.common.bus import Bus, Connection, connect
from services.common.wire import Received

T = TypeVar("T")


class OfGeneration(Protocol):
    @property
    def generation_id(self) -> str: ...


G = TypeVar("G", bound=OfGeneration)


class Tap(Generic[T]):
    """Every message on ``subject``, decoded, in arrival order."""

    def __init__(self, nc: Connection, subject: str, adapter: TypeAdapter[T]) -> None:
        self.nc, self.subject, self.adapter = nc, subject, adapter
        self.queue: asyncio.Queue[T] = asyncio.Queue()
        self.seen: list[T] = []

    async def __aenter__(self) -> Tap[T]:
        async def on(msg: Received) -> None:
            value = self.adapter.validate_json(msg.data)
            self.seen.append(value)
            self.queue.put_nowait(value)

        self._sub = await self.nc.subscribe(self.subject, cb=on)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._sub.unsubscribe()

    async def next(self, timeout: float = 5) -> T:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def quiet(self, seconds: float) -> list[T]:
        """What arrives within ``seconds`` (for asserting that nothing does)."""
        got: list[T] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    got.append(await self.queue.get())
        return got


class ByGeneration(Generic[G]):
    """The items of the frames arriving on a tap (the batches of ``TokenFrame``s, the events of
    ``EventFrame``s), filed by generation: each generation's items read in order, whatever
    else the frames carried. ``frames`` and ``items`` count what arrived."""

    def __init__(self, tap: Tap[Any], unpack: Callable[[Any], Sequence[G]]) -> None:
        self.tap, self.unpack = tap, unpack
        self.of: defaultdict[str, list[G]] = defaultdict(list)  # every item so far, per generation
        self._read: Counter[str] = Counter()
        self.frames = 0
        self.items = 0

    def _file(self, frame: Any) -> list[G]:
        self.frames += 1
        items = list(self.unpack(frame))
        self.items += len(items)
        for item in items:
            self.of[item.generation_id].append(item)
        return items

    async def next(self, generation_id: str, timeout: float = 5) -> G:
        """The generation's next item (``TimeoutError`` when none comes in ``timeout``)."""
        async with asyncio.timeout(timeout):
            while self._read[generation_id] >= len(self.of[generation_id]):
                self._file(await self.tap.queue.get())
        item = self.of[generation_id][self._read[generation_id]]
        self._read[generation_id] += 1
        return item

    def unread(self, generation_id: str) -> list[G]:
        """The generation's items filed but not read yet, now counted as read (what ``next``
        returns after this arrived later than every frame read so far)."""
        items = self.of[generation_id][self._read[generation_id] :]
        self._read[generation_id] = len(self.of[generation_id])
        return items

    async def quiet(self, seconds: float) -> list[G]:
        """Every item that arrives within ``seconds`` (for asserting that nothing does)."""
        return [item for frame in await self.tap.quiet(seconds) for item in self._file(frame)]


@contextlib.asynccontextmanager
async def running(
    run: Callable[..., Coroutine[Any, Any, None]], settings: Any, **kw: Any
) -> AsyncIterator[asyncio.Event]:
    """Run a service's ``run(settings, stop, ready=...)`` until the block ends; yields ``stop``."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(settings, stop, ready=ready, **kw))
    waiter = asyncio.ensure_future(ready.wait())
    try:
        await asyncio.wait((waiter, task), timeout=15, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            await task  # raises what failed
        assert ready.is_set(), "the service did not start"
        yield stop
    finally:
        waiter.cancel()
        stop.set()
        await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def client(nats_url: str, namespace: str) -> AsyncIterator[Bus]:
    """The test's own connection, on the client the services use."""
    nc = await connect(nats_url, "test-client")
    try:
        yield Bus(nc, Subjects(namespace))
    finally:
        await nc.close()


def job(
    generation_id: str,
    text: str = "Hello there",
    *,
    gateway: str = "g1",
    parser: str = "p1",
    deadline_in: float = 30.0,
    **kw: Any,
) -> GenerateJob:
    return GenerateJob(
        generation_id=generation_id,
        encode=EncodeRequest(model="openai/gpt-oss-20b", items=[MessageItem(role="user", content=text)]),
        parse=ParseSpec(request_id=generation_id),
        route=Route(gateway=gateway, parser=parser),
        deadline=time.time() + deadline_in,
        **kw,
    )


def generate_request(
    generation_id: str,
    prompt: list[int],
    *,
    gateway: str = "g1",
    parser: str = "p1",
    deadline_in: float = 30.0,
    resume_tokens: Sequence[int] = (),
    **sampling: Any,
) -> GenerateRequest:
    return GenerateRequest(
        generation_id=generation_id,
        model="openai/gpt-oss-20b",
        prompt_token_ids=prompt,
        stop_token_ids=[200002, 200012],
        resume_tokens=list(resume_tokens),
        sampling=SamplingParams(**sampling),
        parse=ParseSpec(request_id=generation_id),
        route=Route(gateway=gateway, parser=parser),
        deadline=time.time() + deadline_in,
    )


def adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    return TypeAdapter(model)
