"""The whole Chat Completions answer (``ChatCompletion``, openai-python's type) and its usage,
from one choice's state (``events.ChatState``).

Reasoning goes out under BOTH ``reasoning_content`` (SGLang, DeepSeek clients) and
``reasoning`` (vLLM, OpenRouter clients), so either kind of client works unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openai.types.chat import ChatCompletion

from services.gateway.chat.events import usage_json

if TYPE_CHECKING:
    from services.gateway.chat.events import ChatState


def completion(state: ChatState, request_id: str, model: str, created: int) -> ChatCompletion:
    """The whole answer, as openai-python's ChatCompletion (reasoning under both of the
    names clients read)."""
    return ChatCompletion.model_validate(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [
                {"index": 0, "message": message(state), "logprobs": None, "finish_reason": state.finish_reason}
            ],
            "usage": usage_json(state.finished.usage if state.finished else None),
        }
    )


def message(state: ChatState) -> dict[str, Any]:
    reasoning = "".join(state.reasoning) or None
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(state.content) if (state.content or not state.tools) else None,
        "refusal": None,
        "annotations": [],
        "reasoning_content": reasoning,
        "reasoning": reasoning,
    }
    if state.tools:
        msg["tool_calls"] = [
            {"id": t.call_id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in state.tools
        ]
    return msg
