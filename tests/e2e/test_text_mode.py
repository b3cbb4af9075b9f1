"""Text mode end to end: `chorus up --engine openai=URL` / `openai-chat=URL` in front of an
OpenAI-compatible upstream that streams TEXT (raw Harmony, <think> tags, plain, or pre-parsed
deltas in vLLM's and SGLang's styles), split into 3-character chunks so markers arrive broken."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from openai.types.chat import ChatCompletionMessageParam
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from services.common.infra import free_port, wait_for_port
from tests.e2e.conftest import MODEL, RunningStack, Stacks, start_stack

TextStacks = tuple[RunningStack, RunningStack]  # (in front of /v1/completions, of /v1/chat/completions)
HARMONY = (
    "<|channel|>analysis<|message|>The user wants a greeting.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello from text mode!<|return|>"
)


def _last_user(messages: list[dict[str, Any]]) -> str:
    content: str = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    return content


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def completions(request: Request) -> StreamingResponse:
    body = await request.json()
    assert isinstance(body["prompt"], str) and "<|start|>user" in body["prompt"]

    async def gen() -> AsyncIterator[bytes]:
        pieces = [HARMONY[i : i + 3] for i in range(0, len(HARMONY), 3)]
        for i, piece in enumerate(pieces):  # the last text shares its chunk with finish_reason
            last = i == len(pieces) - 1
            yield _sse({"choices": [{"index": 0, "text": piece, "finish_reason": "stop" if last else None}]})
        yield _sse({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 20}})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def chat(request: Request) -> StreamingResponse:
    body = await request.json()
    style = _last_user(body["messages"])

    def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({"choices": [{"index": 0, "delta": d, "finish_reason": finish}]})

    async def gen() -> AsyncIterator[bytes]:
        if "think" in style:
            text = "<think>Pondering.</think>Forty-two."
            for i in range(0, len(text), 3):
                yield delta({"content": text[i : i + 3]})
            yield delta({}, "stop")
        elif "vllm" in style:
            for w in ["Reason", "ing."]:
                yield delta({"reasoning": w})
            yield delta({"content": "Fin"})
            yield delta({"content": "al."}, "stop")  # vLLM: last delta and finish together
        elif "sglang" in style:
            for w in ["Reason", "ing."]:
                yield delta({"reasoning_content": w})
            yield delta({"content": "Final."})
            yield delta({"reasoning_content": None}, "stop")  # SGLang: a separate finish chunk
        elif "tool" in style:
            yield delta(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "x",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
            yield delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]})
            yield delta({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}, "tool_calls")
        else:
            yield delta({"content": "Plain words only."}, "stop")
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def models(_: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
        ]
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()

    class _Alive:
        name = "upstream"

        def alive(self) -> bool:
            return thread.is_alive()

    # wait_for_port reads only ``name`` and ``alive()`` of the ManagedProcess it is typed for
    wait_for_port("127.0.0.1", port, _Alive(), timeout=10)  # type: ignore[arg-type]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


@pytest.fixture(scope="module")
def text_stacks(stacks: Stacks, upstream: str) -> Iterator[TextStacks]:
    completions_stack = start_stack("openai", stacks.nats_url, stacks.redis_url, engines=[f"openai={upstream}"])
    chat_stack = start_stack("openai-chat", stacks.nats_url, stacks.redis_url, engines=[f"openai-chat={upstream}"])
    yield completions_stack, chat_stack
    completions_stack.stop()
    chat_stack.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_raw_harmony_text_from_completions(text_stacks: TextStacks, stream: bool) -> None:
    client = text_stacks[0].client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
    content: str | None
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks if c.choices)
    else:
        msg = client.chat.completions.create(model=MODEL, messages=messages).choices[0].message
        content, reasoning = msg.content, (msg.model_extra or {})["reasoning"]
    assert content == "Hello from text mode!"
    assert reasoning == "The user wants a greeting."


@pytest.mark.parametrize(
    ("style", "content", "reasoning"),
    [
        ("think", "Forty-two.", "Pondering."),
        ("vllm", "Final.", "Reasoning."),
        ("sglang", "Final.", "Reasoning."),
        ("plain", "Plain words only.", None),
    ],
)
def test_chat_upstream_styles(text_stacks: TextStacks, style: str, content: str, reasoning: str | None) -> None:
    client = text_stacks[1].client()
    msg = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": style}]).choices[0].message
    assert msg.content == content
    assert (msg.model_extra or {}).get("reasoning") == reasoning
    resp = client.responses.create(model=MODEL, input=style)
    assert resp.output_text == content


def test_chat_upstream_tool_call(text_stacks: TextStacks) -> None:
    client = text_stacks[1].client()
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "tool"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    )
    assert resp.choices[0].finish_reason == "tool_calls"
    call = (resp.choices[0].message.tool_calls or [])[0]
    assert call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
