"""Snapshots of the exact JSON both APIs return for a fixed simulated output.

Each case scripts the simulated engine's Harmony output (``[[sim:raw=...]]``: reasoning on
``analysis``, a call on ``commentary``, the answer on ``final``), sends the request as raw JSON
(httpx, so every field the gateway writes is seen) and compares the normalised body, or the
list of SSE events, with ``snapshots/<case>.json`` (pretty-printed, sorted keys).

Normalised, because they legitimately vary from run to run: ids (``chatcmpl-``, ``resp_``,
``msg_``, ``rs_``, ``fc_``, ``call_`` + random hex) become ``<prefix><n>``, equal ids staying
equal; ``created``/``created_at``/``completed_at`` (checked to be the current Unix time first);
``cached_tokens`` (the engine's prefix cache remembers earlier requests of the session);
``encrypted_content``; and where text deltas are cut, which follows how the engine's tokens
were batched in flight: neighbouring deltas of one field are merged (as the gateway merges
those of one batch) and ``sequence_number`` is renumbered after checking it counted 0, 1, 2...

Regenerate with ``CHORUS_UPDATE_SNAPSHOTS=1``: the tests then write the files and fail, so a
forgotten update is never green."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import MODEL, RunningStack

SNAPSHOTS = Path(__file__).with_name("snapshots")
UPDATE_ENV = "CHORUS_UPDATE_SNAPSHOTS"

REASONING = "The user greets me. I will answer in one short sentence."
ANSWER = "Hello from Chorus! How can I help you today?"
CALL_REASONING = "I need the current weather for Paris, so I call get_weather."
CALL_ARGS = '{"city": "Paris", "unit": "celsius"}'
ANSWER_RAW = (
    f"[[sim:raw=<|channel|>analysis<|message|>{REASONING}<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>]]"
)
CALL_RAW = (
    f"[[sim:raw=<|channel|>analysis<|message|>{CALL_REASONING}<|end|>"
    f"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{CALL_ARGS}<|call|>]]"
)
GREETING = f"Hi there! {ANSWER_RAW}"
QUESTION = f"What is the weather in Paris? {CALL_RAW}"

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": PARAMETERS},
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": PARAMETERS,
}
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"


@dataclass(frozen=True)
class Case:
    name: str  # the snapshot file's stem
    path: str
    body: dict[str, Any]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def _chat(*content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": c} for c in content], **extra}


def _responses(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, **extra}


CASES = [
    Case("chat_answer", CHAT, _chat(GREETING)),
    Case("chat_answer_stream_usage", CHAT, _chat(GREETING, stream=True, stream_options={"include_usage": True})),
    Case("chat_tool_call", CHAT, _chat(QUESTION, tools=[CHAT_TOOL])),
    Case("chat_tool_call_stream", CHAT, _chat(QUESTION, tools=[CHAT_TOOL], stream=True)),
    Case("chat_error_400", CHAT, _chat("Two answers please.", n=2)),
    Case("responses_answer", RESPONSES, _responses(GREETING)),
    Case("responses_answer_stream", RESPONSES, _responses(GREETING, stream=True)),
    Case("responses_function_call", RESPONSES, _responses(QUESTION, tools=[RESPONSES_TOOL])),
    Case("responses_function_call_stream", RESPONSES, _responses(QUESTION, tools=[RESPONSES_TOOL], stream=True)),
    Case(
        "responses_encrypted_reasoning",
        RESPONSES,
        _responses(GREETING, store=False, include=["reasoning.encrypted_content"]),
    ),
    Case("responses_error_400", RESPONSES, _responses("Too hot.", temperature=9)),
]

_ID = re.compile(r"\b(chatcmpl-|resp_|msg_|rs_|fc_|call_)[0-9a-f]{16,}\b")
_TIMES = frozenset({"created", "created_at", "completed_at"})
_CHAT_TEXT = frozenset({"content", "reasoning", "reasoning_content"})
_RESPONSES_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
    }
)


class Normaliser:
    """Replaces what varies per run by placeholders; checks timestamps against the wall clock."""

    def __init__(self, since: float, until: float) -> None:
        self.since, self.until = int(since), int(until) + 1
        self.ids: dict[str, str] = {}
        self.counts: dict[str, int] = {}

    def _id(self, match: re.Match[str]) -> str:
        if match.group(0) not in self.ids:
            prefix = match.group(1)
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            self.ids[match.group(0)] = f"{prefix}<{self.counts[prefix]}>"
        return self.ids[match.group(0)]

    def __call__(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):  # sorted: placeholders do not depend on the gateway's key order
            return {k: self(value[k], k) for k in sorted(value)}
        if isinstance(value, list):
            return [self(v) for v in value]
        if key in _TIMES and isinstance(value, int) and not isinstance(value, bool):
            assert self.since <= value <= self.until, f"{key}={value} is not the current Unix time"
            return "<timestamp>"
        if key == "cached_tokens" and isinstance(value, int):
            assert value >= 0
            return "<cached_tokens>"
        if key == "encrypted_content" and isinstance(value, str) and value:
            return f"{value.split('.', 1)[0]}.<encrypted>" if "." in value else "<encrypted>"
        if isinstance(value, str):
            return _ID.sub(self._id, value)
        return value


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def _merge_chat(prev: dict[str, Any], cur: dict[str, Any]) -> bool:
    """Merge ``cur`` (a chunk) into ``prev`` when both carry only text of the same fields."""
    if len(prev.get("choices") or []) != 1 or len(cur.get("choices") or []) != 1:
        return False
    p, c = prev["choices"][0], cur["choices"][0]
    if _without(prev, "choices") != _without(cur, "choices") or _without(p, "delta") != _without(c, "delta"):
        return False
    pd, cd = p["delta"], c["delta"]
    if p.get("finish_reason") is not None or pd.keys() != cd.keys():
        return False
    if pd.keys() <= _CHAT_TEXT and all(isinstance(pd[k], str) and isinstance(cd[k], str) for k in pd):
        for k in pd:
            pd[k] += cd[k]
        return True
    if pd.keys() == {"tool_calls"} and len(pd["tool_calls"]) == len(cd["tool_calls"]) == 1:
        pt, ct = pd["tool_calls"][0], cd["tool_calls"][0]
        if (
            pt.keys() == ct.keys() == {"index", "function"}
            and pt["index"] == ct["index"]
            and pt["function"].keys() == ct["function"].keys() == {"arguments"}
        ):
            pt["function"]["arguments"] += ct["function"]["arguments"]
            return True
    return False


def _merge_responses(prev: dict[str, Any], cur: dict[str, Any]) -> bool:
    """Merge ``cur`` into ``prev`` when both are deltas of the same part of the same item."""
    if prev.get("type") not in _RESPONSES_DELTAS or prev.get("type") != cur.get("type"):
        return False
    if _without(prev, "delta", "sequence_number", "logprobs") != _without(cur, "delta", "sequence_number", "logprobs"):
        return False
    prev["delta"] += cur["delta"]
    if "logprobs" in prev or "logprobs" in cur:
        prev["logprobs"] = [*(prev.get("logprobs") or []), *(cur.get("logprobs") or [])]
    return True


def canonical_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events with neighbouring text deltas merged and sequence numbers renumbered."""
    numbers = [
        e["data"]["sequence_number"] for e in events if isinstance(e["data"], dict) and "sequence_number" in e["data"]
    ]
    assert numbers == list(range(len(numbers))), f"sequence numbers not 0, 1, 2...: {numbers}"
    out: list[dict[str, Any]] = []
    for event in events:
        prev = out[-1] if out else None
        data = event["data"]
        if (
            prev is not None
            and prev["event"] == event["event"]
            and isinstance(prev["data"], dict)
            and isinstance(data, dict)
            and (_merge_chat(prev["data"], data) or _merge_responses(prev["data"], data))
        ):
            continue
        out.append(event)
    for n, event in enumerate(e for e in out if isinstance(e["data"], dict) and "sequence_number" in e["data"]):
        event["data"]["sequence_number"] = n
    return out


def sse_events(lines: list[str]) -> list[dict[str, Any]]:
    """An SSE body's events in order: the ``event:`` name (None without one) and the data,
    parsed as JSON unless it is ``[DONE]``."""
    events: list[dict[str, Any]] = []
    name: str | None = None
    data: list[str] = []
    for line in [*lines, ""]:
        if line.startswith(":"):
            continue
        if not line:
            if data:
                text = "\n".join(data)
                events.append({"event": name, "data": text if text == "[DONE]" else json.loads(text)})
            name, data = None, []
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].removeprefix(" "))
        else:
            raise AssertionError(f"not an SSE line: {line!r}")
    return events


def observe(stack: RunningStack, case: Case) -> dict[str, Any]:
    """What the gateway answers to ``case``: status, content type and the normalised body or events."""
    since = time.time()
    with stack.http() as http, http.stream("POST", case.path, json=case.body) as resp:
        status, content_type = resp.status_code, resp.headers.get("content-type")
        if case.stream and status == 200:
            raw: Any = {"events": sse_events(list(resp.iter_lines()))}
        else:
            raw = {"body": json.loads(resp.read())}
    normalised = Normaliser(since, time.time())(raw)
    if "events" in normalised:
        normalised["events"] = canonical_events(normalised["events"])
    return {"status": status, "content_type": content_type, **normalised}


def render(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_snapshot(stack: RunningStack, case: Case) -> None:
    got = render(observe(stack, case))
    path = SNAPSHOTS / f"{case.name}.json"
    if os.environ.get(UPDATE_ENV) == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
        pytest.fail(f"wrote {path}; review it, then run again without {UPDATE_ENV}=1")
    assert path.exists(), f"no snapshot {path}: run with {UPDATE_ENV}=1 to write it"
    assert got == path.read_text(encoding="utf-8"), f"{case.name}: the gateway's JSON differs from {path}"
