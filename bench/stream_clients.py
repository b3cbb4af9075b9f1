"""The benchmark's two streaming clients (aiohttp), one request each: ``direct_once`` on the
engine with the prompt ids Chorus would render, ``chorus_once`` through Chorus's Chat Completions
API; each gives the time to its first content token, its total time and its output tokens.
``run_load`` runs many at a concurrency and keeps the failures apart (``Load``)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.harmony import harmony_encoding

MODEL = "openai/gpt-oss-20b"
MESSAGE_TOKEN = 200008  # <|message|>: the first id after it is the first content token
STOP_TOKEN_IDS = [200002, 200012]  # <|return|>, <|call|>


# ------------------------------------------------------------------------------------ helpers


def prompt_ids(text: str) -> list[int]:
    """The Harmony token ids Chorus renders for this one-message chat (default system message)."""
    from openai_harmony import Conversation, Message, Role, SystemContent

    conv = Conversation.from_messages(
        [
            Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
            Message.from_role_and_content(Role.USER, text),
        ]
    )
    return list(harmony_encoding().render_conversation_for_completion(conv, Role.ASSISTANT))


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def chat_text(tokens: int, delay_ms: float = 0.0) -> str:
    pace = f" [[sim:delay_ms={delay_ms:g}]]" if delay_ms else ""
    return f"Benchmark question [[sim:tokens={tokens}]]{pace}"


def count_ids(line: bytes) -> int:
    """Token ids in a vLLM stream line's ``"token_ids":[...]``, without parsing the JSON."""
    start = line.find(b'"token_ids":[')
    if start < 0:
        return 0
    start += len(b'"token_ids":[')
    end = line.find(b"]", start)
    body = line[start:end].strip()
    return body.count(b",") + 1 if body else 0


# ------------------------------------------------------------------------------------ clients


@dataclass
class Result:
    ttft: float  # seconds to the first content token (0 when none came)
    total: float  # seconds to the end of the stream
    tokens: int  # output tokens: ids received (direct) or usage.completion_tokens (chorus)
    usage_tokens: int = 0  # the usage chunk's completion_tokens (both sides, as a cross-check)


class RequestFailed(Exception):
    """One benchmark request that did not complete (HTTP error or an error in the stream)."""


async def check_status(resp: aiohttp.ClientResponse) -> None:
    if resp.status != 200:
        text = (await resp.text(errors="replace")).strip()
        raise RequestFailed(f"HTTP {resp.status}: {text[:300]}")


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The ``data:`` lines of an event stream, ``[DONE]`` left out; everything that has arrived
    is split at once (one wake-up per network read, not per line)."""
    rest = b""
    async for data in resp.content.iter_any():
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                yield line
    if rest.startswith(b"data: ") and not rest.startswith(b"data: [DONE]"):
        yield rest


async def direct_once(http: aiohttp.ClientSession, engine: str, ids: list[int]) -> Result:
    """Stream one completion from the engine with the rendered prompt ids."""
    body = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": STOP_TOKEN_IDS,
    }
    t0 = time.perf_counter()
    ttft = 0.0
    seen_message = False
    tokens = usage = 0
    async with http.post(f"{engine}/v1/completions", json=body) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            if not ttft:  # parse until the first content token; then only count
                chunk = json.loads(raw[6:])
                if chunk.get("error"):
                    raise RequestFailed(f"engine error: {chunk['error']}")
                for choice in chunk.get("choices") or ():
                    for tid in choice.get("token_ids") or ():
                        tokens += 1
                        if seen_message and not ttft:
                            ttft = time.perf_counter() - t0
                        seen_message = seen_message or tid == MESSAGE_TOKEN
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
            elif b'"error"' in raw:
                raise RequestFailed(f"engine error: {raw[6:306].decode(errors='replace')}")
            elif b'"usage"' in raw and b'"usage":null' not in raw:
                usage = json.loads(raw[6:])["usage"]["completion_tokens"]
            else:
                tokens += count_ids(raw)
    if not usage:
        raise RequestFailed("the engine's stream ended without its usage chunk")
    return Result(ttft, time.perf_counter() - t0, tokens, usage)


async def chorus_once(http: aiohttp.ClientSession, base: str, text: str) -> Result:
    """Stream one chat completion through Chorus."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = 0.0
    usage = 0
    async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            if ttft and b'"usage"' not in raw and b'"error"' not in raw:
                continue  # after the first content chunk only usage (or an error) matters
            chunk = json.loads(raw[6:])
            if chunk.get("error"):
                raise RequestFailed(f"chorus error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            if not ttft:
                for choice in chunk.get("choices") or ():
                    d = choice.get("delta") or {}
                    if d.get("reasoning") or d.get("reasoning_content") or d.get("content") or d.get("tool_calls"):
                        ttft = time.perf_counter() - t0
                        break
    if not usage:
        raise RequestFailed("Chorus's stream ended without its usage chunk")
    return Result(ttft, time.perf_counter() - t0, usage, usage)


@dataclass
class Load:
    """The completed requests of a run and the errors of the others."""

    results: list[Result] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def call(self, fn: Callable[[], Awaitable[Result]]) -> None:
        try:
            self.results.append(await fn())
        except (RequestFailed, aiohttp.ClientError, TimeoutError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")


async def run_load(fn: Callable[[], Awaitable[Result]], n: int, concurrency: int) -> Load:
    load = Load()
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            await load.call(fn)

    await asyncio.gather(*(one() for _ in range(n)))
    return load
