"""Engine streams as real vLLM and SGLang servers write them (``recorded/``, each fixture's
source in its README), through the dispatcher's decode path: ``EngineStream`` (SSE framing),
the adapter's decoder, then ``relay`` and ``BatchWriter`` (what the parser is sent). Each body
is read whole, at random byte boundaries and over HTTP; the decode must not change.

A fixture whose expected decode Chorus does not give yet is a known bug (``KNOWN_BUGS``),
marked ``xfail(strict=True)``: fixing the decoder turns it into a failure that asks for the
mark to go."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from contracts.errors import ErrorCode
from contracts.messages.generate import (
    EngineFinishReason,
    EngineUsage,
    GenerateRequest,
    ParseSpec,
    Route,
    SamplingParams,
    TokenBatch,
)
from services.common.harmony import CALL, RETURN
from services.dispatcher.batches import BatchWriter, relay
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.base import EngineAdapter, EngineChunk
from services.dispatcher.engines.http import HttpStream
from services.dispatcher.engines.sglang import Mode
from services.dispatcher.engines.stream import EngineStream, open_stream
from tests.dispatcher.tiny_server import SSE_HEAD, Tiny, chunk, client, tiny

RECORDED = Path(__file__).parent / "recorded"
NAMES = sorted(path.stem for path in RECORDED.glob("*.sse"))

KNOWN_BUGS: dict[str, str] = {}  # fixture name -> the bug it shows (all fixed so far)


class ExpectedError(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: ErrorCode
    message: str
    retryable: bool


class Expected(BaseModel):
    """What the dispatcher should publish for a recorded stream."""

    model_config = ConfigDict(frozen=True)

    token_ids: list[int]
    finish_reason: EngineFinishReason
    stop_token_id: int | None
    usage: EngineUsage | None  # as the engine reported it; None: it reported none
    error: ExpectedError | None


class Sidecar(BaseModel):
    model_config = ConfigDict(frozen=True)

    engine: str
    version: str
    generation_id: str
    max_tokens: int | None
    stop: list[str]
    prompt_token_ids: list[int]
    expect: Expected
    sglang_mode: Mode | None = None


@dataclass(frozen=True)
class Recorded:
    name: str
    body: bytes
    meta: Sidecar

    @property
    def request(self) -> GenerateRequest:
        meta = self.meta
        return GenerateRequest(
            generation_id=meta.generation_id,
            model="openai/gpt-oss-20b",
            prompt_token_ids=meta.prompt_token_ids,
            stop_token_ids=[RETURN, CALL],
            parse=ParseSpec(request_id=meta.generation_id),
            route=Route(gateway="g", parser="p"),
            deadline=2e9,
            sampling=SamplingParams(max_tokens=meta.max_tokens, stop=meta.stop),
        )

    def adapter(self, mode: Mode | None = None) -> EngineAdapter:
        return make_adapter(self.meta.engine, sglang_mode=mode or self.meta.sglang_mode or "auto")

    def modes(self) -> list[Mode | None]:
        """The adapter settings a stream must decode under: SGLang's declared one and auto."""
        return [self.meta.sglang_mode, "auto"] if self.meta.engine == "sglang" else [None]


@cache
def recorded(name: str) -> Recorded:
    meta = Sidecar.model_validate_json((RECORDED / f"{name}.json").read_bytes())
    return Recorded(name, (RECORDED / f"{name}.sse").read_bytes(), meta)


@dataclass(frozen=True)
class Decoded:
    """One generation as the parser receives it."""

    token_ids: list[int]
    finish_reason: EngineFinishReason | None
    stop_token_id: int | None
    usage: EngineUsage | None
    error: ExpectedError | None

    @classmethod
    def of(cls, batches: list[TokenBatch]) -> Decoded:
        assert batches and batches[-1].done and not any(b.done for b in batches[:-1])
        offsets = [sum(len(b.token_ids) for b in batches[:i]) for i in range(len(batches))]
        assert [b.offset for b in batches] == offsets
        last = batches[-1]
        error = (
            None
            if last.error is None
            else ExpectedError(code=last.error.code, message=last.error.message, retryable=last.error.retryable)
        )
        return cls([t for b in batches for t in b.token_ids], last.finish_reason, last.stop_token_id, last.usage, error)

    @classmethod
    def expected(cls, rec: Recorded) -> Decoded:
        want = rec.meta.expect
        # without the engine's usage, BatchWriter counts it
        usage = want.usage or EngineUsage(
            prompt_tokens=len(rec.meta.prompt_token_ids), completion_tokens=len(want.token_ids)
        )
        return cls(want.token_ids, want.finish_reason, want.stop_token_id, usage, want.error)


class ReplayedAnswer:
    """Stands in for the engine answer's ``HttpStream``: hands the recorded body to the stream
    in the given pieces, one call per socket read, then ends the answer."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self, on_data: Callable[[bytes], None], pace: Callable[[], float] | None = None) -> None:
        for piece in self.pieces:
            on_data(piece)
        self.done.set_result(None)

    def close(self) -> None:
        pass


def cut(body: bytes, positions: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(positions)), len(body)]
    return [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def random_pieces(body: bytes, seed: int) -> list[bytes]:
    """The body cut at random places: single bytes, a few bytes, runs of events."""
    rng = random.Random(seed)
    positions, at = [], 0
    while at < len(body):
        at += rng.choice([1, 1, 2, 3, 7, 50, 333, 2048])
        positions.append(at)
    return cut(body, [p for p in positions if p < len(body)])


def splits(body: bytes) -> list[list[bytes]]:
    """One read; a read per byte; every event in its own read; random cuts."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    return [
        [body],
        [body[i : i + 1] for i in range(len(body))],
        events,
        *(random_pieces(body, seed) for seed in range(5)),
    ]


async def relayed(rec: Recorded, pieces: list[bytes], mode: Mode | None = None) -> list[TokenBatch]:
    """The pieces through EngineStream, the adapter's decoder, relay and BatchWriter."""
    req = rec.request
    answer = ReplayedAnswer(pieces)
    stream = EngineStream(cast(HttpStream, answer), rec.adapter(mode).decoder(req), "recorded")
    batches: list[TokenBatch] = []
    await relay(stream, BatchWriter(lambda batch, urgent: batches.append(batch), req))
    stream.close()
    return batches


async def chunks_of(rec: Recorded, pieces: list[bytes], mode: Mode | None = None) -> list[EngineChunk]:
    """The decoder's chunks, flattened over the reads."""
    req = rec.request
    stream = EngineStream(cast(HttpStream, ReplayedAnswer(pieces)), rec.adapter(mode).decoder(req), "recorded")
    got: list[EngineChunk] = []

    def sink(chunks: list[EngineChunk]) -> bool:
        got.extend(chunks)
        return False

    stream.start(sink)
    await stream.ended
    return got


def cases() -> list[Any]:
    params = []
    for name in NAMES:
        for mode in recorded(name).modes():
            marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name])] if name in KNOWN_BUGS else []
            params.append(pytest.param(name, mode, marks=marks, id=f"{name}-{mode or 'vllm'}"))
    return params


@pytest.mark.parametrize(("name", "mode"), cases())
async def test_recorded_stream_decodes_as_expected(name: str, mode: Mode | None) -> None:
    """Whole, byte by byte, event by event and cut at random: the expected decode each time."""
    rec = recorded(name)
    want = Decoded.expected(rec)
    for pieces in splits(rec.body):
        assert b"".join(pieces) == rec.body
        assert Decoded.of(await relayed(rec, pieces, mode)) == want


@pytest.mark.parametrize("name", NAMES)
async def test_chunks_do_not_depend_on_read_boundaries(name: str) -> None:
    """The decoder sees the same events in the same order however the bytes arrive."""
    rec = recorded(name)
    whole = await chunks_of(rec, [rec.body])
    assert whole  # every recorded stream says something
    for pieces in splits(rec.body)[1:]:
        assert await chunks_of(rec, pieces) == whole


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(NAMES), st.lists(st.integers(min_value=1, max_value=20_000), max_size=60))
def test_any_cut_gives_the_same_generation(name: str, positions: list[int]) -> None:
    rec = recorded(name)

    async def both() -> tuple[Decoded, Decoded]:
        whole = Decoded.of(await relayed(rec, [rec.body]))
        return whole, Decoded.of(await relayed(rec, cut(rec.body, [p for p in positions if p < len(rec.body)])))

    whole, pieces = asyncio.run(both())
    assert pieces == whole


@pytest.mark.parametrize("name", NAMES)
async def test_recorded_stream_over_http(name: str) -> None:
    """The real client path: the adapter's request, the engine's chunked SSE answer cut at random
    places, open_stream and relay; the same generation as the recorded bytes replayed in-process."""
    rec = recorded(name)
    pieces = random_pieces(rec.body, seed=len(name))

    async def answer(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD)
        for piece in pieces:
            writer.write(chunk(piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    req, adapter = rec.request, rec.adapter()
    batches: list[TokenBatch] = []
    async with tiny(answer) as server, client() as http:
        stream = await open_stream(http, server.url, adapter, req, accept_timeout=5, read_timeout=5)
        try:
            await relay(stream, BatchWriter(lambda batch, urgent: batches.append(batch), req))
        finally:
            stream.close()
        sent = server.requests[0]
    path, body = adapter.request(req)
    assert sent.startswith(b"POST " + path.encode())
    assert orjson.loads(sent.split(b"\r\n\r\n", 1)[1]) == body
    assert Decoded.of(batches) == Decoded.of(await relayed(rec, [rec.body]))


def test_every_fixture_is_complete_and_named_in_the_readme() -> None:
    readme = (RECORDED / "README.md").read_text()
    assert len(NAMES) >= 10
    assert {p.stem for p in RECORDED.glob("*.json")} == set(NAMES)
    for name in NAMES:
        rec = recorded(name)
        assert f"`{name}`" in readme, f"{name} has no source in recorded/README.md"
        assert rec.body.endswith(b"data: [DONE]\n\n")
    assert set(KNOWN_BUGS) <= set(NAMES)
