"""The fleet benchmark's client (bench_fleet.py): each conversation's turns in order over one
aiohttp session, streamed through Chat Completions (the whole history re-sent) or the
Responses API (chained by ``previous_response_id``), with what the client saw of each request
(``Sample``: time to first token, prompt and cached tokens)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

# bench/ modules (the script's directory is on sys.path)
from fleet_workload import Conversation, Workload
from stream_clients import MODEL, RequestFailed, check_status, sse_data


@dataclass
class Sample:
    """One request: what the client saw, and (after the run) what the engines saw."""

    conversation: int
    turn: int
    api: str
    request_id: str  # ours (x-request-id)
    api_id: str = ""  # the completion's or response's id: the request id the engine sees
    sent: float = 0.0  # seconds since the mode's run started
    ttft: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # as the engine reported it (usage)
    engine: int = -1  # which engine served it (its /sim/requests)
    ideal: int = 0
    error: str = ""


TEXT_DELTAS = {"response.output_text.delta", "response.reasoning_text.delta", "response.reasoning_summary_text.delta"}


async def chat_turn(http: aiohttp.ClientSession, base: str, messages: list[dict[str, str]], s: Sample) -> str:
    """One streamed chat completion; the answer's content."""
    body = {"model": MODEL, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    content: list[str] = []
    usage: dict[str, Any] | None = None
    async with http.post(f"{base}/v1/chat/completions", json=body, headers={"x-request-id": s.request_id}) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            chunk = json.loads(raw[6:])
            s.api_id = s.api_id or chunk.get("id", "")
            if chunk.get("error"):
                raise RequestFailed(f"chorus error: {chunk['error']}")
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if not s.ttft and (delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")):
                    s.ttft = time.perf_counter() - t0
                content.append(delta.get("content") or "")
            usage = chunk.get("usage") or usage
    if usage is None:
        raise RequestFailed("the stream ended without its usage chunk")
    s.prompt_tokens = usage["prompt_tokens"]
    s.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return "".join(content)


async def responses_turn(
    http: aiohttp.ClientSession, base: str, instructions: str, text: str, previous: str | None, s: Sample
) -> str:
    """One streamed, stored response continuing ``previous``; its id."""
    body: dict[str, Any] = {"model": MODEL, "instructions": instructions, "input": text, "store": True, "stream": True}
    if previous:
        body["previous_response_id"] = previous
    t0 = time.perf_counter()
    done: dict[str, Any] | None = None
    async with http.post(f"{base}/v1/responses", json=body, headers={"x-request-id": s.request_id}) as resp:
        await check_status(resp)
        async for raw in sse_data(resp):
            event = json.loads(raw[6:])
            kind = event.get("type", "")
            if kind == "response.created":
                s.api_id = event["response"]["id"]
            if not s.ttft and kind in TEXT_DELTAS and event.get("delta"):
                s.ttft = time.perf_counter() - t0
            elif kind == "response.completed":
                done = event["response"]
            elif kind in ("error", "response.failed", "response.incomplete"):
                raise RequestFailed(f"{kind}: {json.dumps(event)[:300]}")
    if done is None or not done.get("usage"):
        raise RequestFailed("the stream ended without response.completed and its usage")
    s.prompt_tokens = done["usage"]["input_tokens"]
    s.cached_tokens = (done["usage"].get("input_tokens_details") or {}).get("cached_tokens") or 0
    return str(done["id"])


async def converse(
    http: aiohttp.ClientSession, base: str, tag: str, instructions: str, conv: Conversation, t_start: float
) -> list[Sample]:
    """The conversation's turns in order; stops at a failed turn (the next needs its answer)."""
    samples: list[Sample] = []
    history = [{"role": "system", "content": instructions}]
    previous: str | None = None
    for turn, text in enumerate((conv.first_message, *conv.questions)):
        s = Sample(conv.index, turn, conv.api, f"fleet-{tag}-c{conv.index:02d}-t{turn}")
        samples.append(s)
        s.sent = time.perf_counter() - t_start
        try:
            if conv.api == "chat":
                history.append({"role": "user", "content": text})
                history.append({"role": "assistant", "content": await chat_turn(http, base, history, s)})
            else:
                previous = await responses_turn(http, base, instructions, text, previous, s)
        except (RequestFailed, aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            s.error = f"{type(exc).__name__}: {exc}"
            break
    return samples


async def drive(
    base: str, tag: str, instructions: str, conversations: list[Conversation], wl: Workload
) -> list[Sample]:
    """Every conversation, ``wl.concurrency`` at a time (each holds its place for all its turns)."""
    sem = asyncio.Semaphore(wl.concurrency)
    t_start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:

        async def one(conv: Conversation) -> list[Sample]:
            async with sem:
                return await converse(http, base, tag, instructions, conv, t_start)

        runs = await asyncio.gather(*(one(c) for c in conversations))
    return [s for run in runs for s in run]
