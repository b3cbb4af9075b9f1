"""Anthropic Messages API request bodies for the gateway's Messages tests: a minimal body with
fields replaced, a client tool, and a main-loop request as Claude Code 2.1 sends it (its
thinking signed by the test's ``SEALER``)."""

from __future__ import annotations

import copy
import json
from typing import Any

from anthropic.types.beta import BetaToolParam
from anthropic.types.beta.message_create_params import MessageCreateParamsStreaming
from cryptography.fernet import Fernet

from services.gateway.sealing import Sealer

SEALER = Sealer([Fernet.generate_key()])
BASE: dict[str, Any] = {"model": "gpt-oss-120b", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
BILLING = "x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;"


def body(**fields: Any) -> dict[str, Any]:
    """``BASE`` (a copy) with ``fields`` set."""
    return {**copy.deepcopy(BASE), **fields}


def tool(name: str, **extra: Any) -> dict[str, Any]:
    """A client tool taking one string, ``query``."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    return {"name": name, "description": f"The {name} tool.", "input_schema": schema, **extra}


def cc_tool(name: str, *, deferred: bool = False, cached: bool = False) -> BetaToolParam:
    """One of Claude Code's tools (its MCP tools are deferred: ``defer_loading``, full schema)."""
    spec = BetaToolParam(name=name, description=f"The {name} tool.", input_schema=dict(tool(name)["input_schema"]))
    if deferred:
        spec["defer_loading"] = True
    if cached:
        spec["cache_control"] = {"type": "ephemeral"}
    return spec


def claude_code_body() -> MessageCreateParamsStreaming:
    """A main-loop request as Claude Code 2.1.x sends it (``POST /v1/messages?beta=true``)."""
    core = ["Task", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "WebFetch", "TodoWrite", "ToolSearch"]
    deferred = ["mcp__github__get_me", "mcp__slack__send_message"]
    return {
        "model": "claude-opus-4-6",
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": "user_5e1c_account__session_0b9a"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "system": [
            {"type": "text", "text": BILLING},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
        ],
        "tools": [cc_tool(n) for n in core]
        + [cc_tool(n, deferred=True, cached=n == deferred[-1]) for n in deferred],  # the last: a cache breakpoint
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nToday's date is 2026-07-01.\n</system-reminder>"},
                    {"type": "text", "text": "What is in this directory?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": SEALER.seal("The user wants a listing.")},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {"role": "system", "content": "Plan mode is active: do not edit files."},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "README.md\nsrc",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }


def claude_code_body_dict() -> dict[str, Any]:
    """``claude_code_body()`` as the plain JSON data the gateway reads."""
    data: dict[str, Any] = json.loads(json.dumps(claude_code_body()))
    return data
