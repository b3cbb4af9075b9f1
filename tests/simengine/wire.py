"""Request bodies as Chorus's adapters send them to each protocol, and a stream read as its
events (for the simulator's HTTP tests)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from services.common.harmony import CALL, RETURN

STOPS = [RETURN, CALL]


def vllm_body(prompt: list[int], rid: str, **kw: Any) -> dict[str, Any]:
    return {
        "model": "openai/gpt-oss-20b",
        "prompt": prompt,
        "max_tokens": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": STOPS,
        "request_id": rid,
        **kw,
    }


def sglang_body(prompt: list[int], rid: str, **sp: Any) -> dict[str, Any]:
    return {
        "input_ids": prompt,
        "rid": rid,
        "stream": True,
        "sampling_params": {
            "max_new_tokens": 4096,
            "stop_token_ids": STOPS,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            **sp,
        },
    }


async def events(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with http.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["x-chorus-simulator"] == "true"
        lines = [line async for line in resp.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]
