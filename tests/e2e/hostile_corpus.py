"""The corpora of the hostile-input fuzz suite (test_hostile.py): valid requests that exercise
every part of Chat Completions and Responses (every field, tools of every kind, structured
output, stored state), for the mutator (hostile_mutations.py) to spoil."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.e2e.conftest import MODEL

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
    "additionalProperties": False,
}
ANSWER = {
    "type": "object",
    "properties": {
        "a": {"type": "string"},
        "n": {"type": "array", "items": {"$ref": "#/$defs/n"}},
        "o": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/n"}]},
    },
    "required": ["a"],
    "additionalProperties": False,
    "$defs": {"n": {"type": "number"}},
}


@dataclass(frozen=True)
class Seeds:
    """Stored state the corpora point at (ids a mutation can spoil)."""

    response_id: str
    conversation_id: str
    item_id: str
    compaction: str  # a sealed compaction item's encrypted_content
    encrypted_reasoning: str | None


def chat_corpus() -> list[dict[str, Any]]:
    hi = [{"role": "user", "content": "hi"}]
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather for a city", "parameters": WEATHER, "strict": True},
    }
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools when useful."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}], "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I need the weather.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.", "reasoning": "Done."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    return [
        {"model": MODEL, "messages": hi, "max_tokens": 2},
        {
            "model": MODEL,
            "messages": history,
            "tools": [tool],
            "max_tokens": 4,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 7,
            "stop": ["\n\n", "END"],
            "user": "u1",
            "metadata": {"k": "v"},
            "reasoning_effort": "low",
            "parallel_tool_calls": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {
            "model": MODEL,
            "messages": hi,
            "max_completion_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": ANSWER},
            },
        },
        {
            "model": MODEL,
            "messages": history[2:],
            "max_tokens": 3,
            "response_format": {"type": "json_object"},
            "tools": [tool],
            "tool_choice": "none",
            "n": 1,
            "logprobs": False,
            "store": False,
            "service_tier": "auto",
        },
        {
            "model": MODEL,
            "messages": history,
            "max_tokens": 4,
            "stream": True,
            "tools": [tool],
            "tool_choice": "required",
            "verbosity": "low",
            "prompt_cache_key": "k",
            "safety_identifier": "s",
        },
        {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]}
            ],
            "max_tokens": 1,
            "response_format": {"type": "text"},
            "modalities": ["text"],
        },
    ]


def responses_corpus(seeds: Seeds) -> list[dict[str, Any]]:
    function = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather",
        "parameters": WEATHER,
        "strict": True,
    }
    namespace = {
        "type": "namespace",
        "name": "files",
        "description": "File tools",
        "tools": [
            {
                "type": "function",
                "name": "read",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
    }
    mcp = {
        "type": "mcp",
        "server_label": "local",
        "server_url": "http://127.0.0.1:9/mcp",  # nothing listens
        "require_approval": "never",
        "allowed_tools": ["lookup"],
        "headers": {"X-Key": "v"},
    }
    reasoning: dict[str, Any] = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "s"}],
        "content": [{"type": "reasoning_text", "text": "think"}],
    }
    if seeds.encrypted_reasoning:
        reasoning = {**reasoning, "encrypted_content": seeds.encrypted_reasoning}
    history = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        reasoning,
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "files", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "file"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Sunny."}],
            "status": "completed",
            "phase": "final_answer",
        },
        {"role": "user", "content": "thanks"},
    ]
    mcp_items = [
        {
            "type": "mcp_list_tools",
            "id": "ml_1",
            "server_label": "local",
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
        },
        {
            "type": "mcp_call",
            "id": "mc_1",
            "server_label": "local",
            "name": "lookup",
            "arguments": "{}",
            "output": "found",
        },
        {"type": "mcp_approval_request", "id": "ma_1", "server_label": "local", "name": "lookup", "arguments": "{}"},
        {"type": "mcp_approval_response", "approval_request_id": "ma_1", "approve": False, "reason": "no"},
        {"role": "user", "content": "go on"},
    ]
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    return [
        {"model": MODEL, "input": "hi", "max_output_tokens": 2},
        {
            "model": MODEL,
            "input": history,
            "instructions": "Answer briefly.",
            "tools": [function, namespace],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "temperature": 0.7,
            "top_p": 0.9,
            "max_tool_calls": 2,
            "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": fmt, "verbosity": "low"},
            "metadata": {"k": "v"},
            "user": "u",
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "truncation": "disabled",
            "max_output_tokens": 4,
            "service_tier": "auto",
        },
        {
            "model": MODEL,
            "input": "hi",
            "stream": True,
            "max_output_tokens": 3,
            "tools": [function],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "stream_options": {"include_obfuscation": False},
        },
        {
            "model": MODEL,
            "input": [{"role": "user", "content": "more"}],
            "previous_response_id": seeds.response_id,
            "max_output_tokens": 2,
            "text": {"format": {"type": "json_object"}},
        },
        {
            "model": MODEL,
            "input": "again",
            "conversation": {"id": seeds.conversation_id},
            "max_output_tokens": 2,
            "store": False,
        },
        {"model": MODEL, "input": mcp_items, "tools": [mcp], "max_output_tokens": 2, "prompt_cache_key": "p"},
        {
            "model": MODEL,
            "input": [
                {"type": "item_reference", "id": seeds.item_id},
                {"type": "compaction", "encrypted_content": seeds.compaction},
                {"type": "web_search_call", "id": "ws_1"},
                {"role": "user", "content": "ok"},
            ],
            "max_output_tokens": 2,
            "tools": [{"type": "web_search"}],
            "tool_choice": "none",
        },
        {"model": MODEL, "input": "later", "background": True, "store": True, "max_output_tokens": 2},
        {
            "model": MODEL,
            "input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger"}],
            "context_management": [{"type": "compaction", "compact_threshold": 1000}],
            "max_output_tokens": 2,
        },
    ]
