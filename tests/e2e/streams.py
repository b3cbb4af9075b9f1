"""Streams for the fault tests: many at once through a stack, each recorded (its text, its
reasoning, its longest pause between two events, the error it ended with), so that a run with
a process killed half-way can be compared with an undisturbed one."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import openai

from tests.e2e.conftest import MODEL, RunningStack
from tests.waiting import until

STREAMS = 8
# ~300 answer tokens at 8 ms a token: a stream lasts about 2.5 s, long enough to be cut
PROMPT = "Fault test {i} [[sim:tokens=300]] [[sim:delay_ms=8]]"


@dataclass
class Streamed:
    reasoning: str
    content: str
    longest_pause: float
    error: str | None = None


async def chat_stream(client: openai.AsyncOpenAI, i: int, begun: set[int] | None = None) -> Streamed:
    """Stream ``i``; it is added to ``begun`` at its first text."""
    reasoning, content, pause = [], [], 0.0
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT.format(i=i)}], stream=True
    )
    last = time.monotonic()
    async for chunk in stream:
        now = time.monotonic()
        pause, last = max(pause, now - last), now
        if chunk.choices:
            delta = chunk.choices[0].delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            if begun is not None and (content[-1] or reasoning[-1]):
                begun.add(i)
    return Streamed("".join(reasoning), "".join(content), pause)


async def responses_stream(client: openai.AsyncOpenAI, i: int, begun: set[int] | None = None) -> Streamed:
    """Stream ``i``; it is added to ``begun`` at its first text."""
    reasoning, content, pause = [], [], 0.0
    error = None
    stream = await client.responses.create(model=MODEL, input=PROMPT.format(i=i), stream=True)
    last = time.monotonic()
    async for event in stream:
        now = time.monotonic()
        pause, last = max(pause, now - last), now
        if event.type == "response.output_text.delta":
            content.append(event.delta)
        elif event.type == "response.reasoning_text.delta":
            reasoning.append(event.delta)
        if begun is not None and event.type in ("response.output_text.delta", "response.reasoning_text.delta"):
            begun.add(i)
        elif event.type == "response.completed":
            # the stored answer says the same as the stream
            assert event.response.output_text == "".join(content)
        elif event.type in ("response.failed", "error"):
            error = str(event)
    return Streamed("".join(reasoning), "".join(content), pause, error)


async def run_streams(
    stack: RunningStack, api: str, during: Callable[[], None] | None = None, *, count: int = STREAMS
) -> list[Streamed]:
    """``count`` streams at once; ``during()`` runs once they are all well under way."""
    client = stack.async_client()
    fn = chat_stream if api == "chat" else responses_stream
    begun: set[int] = set()
    tasks = [asyncio.create_task(fn(client, i, begun)) for i in range(count)]
    if during is not None:
        # every stream sending text (or one ended already: gather says how), then a pause
        await until(
            lambda: len(begun) == count or any(task.done() for task in tasks),
            60,
            lambda: f"every stream sending text (began: {sorted(begun)})",
        )
        await asyncio.sleep(0.8)  # a pause, not a wait: about 100 of 300 tokens, a third of the way through
        during()
    return list(await asyncio.gather(*tasks))


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
