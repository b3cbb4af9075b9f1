"""Hostile input, end to end (issue 9): whatever a client sends, the answer is below 500, an
error is OpenAI's error JSON, and the keep-alive connection it came on keeps serving.

A corpus of valid requests (every field of Chat Completions and Responses, tools of every
kind, structured output, stored state) is mutated at every level: wrong types, dropped and
unknown fields, unknown enum values, extreme numbers, nesting past the limit, lone surrogates,
NUL bytes, containers where strings belong, huge strings; and on the wire: non-JSON bodies,
wrong content types, empty and truncated bodies, chunked uploads. Hypothesis draws each batch
(a seed, and values with its edge cases); a seeded mutator spends them, fast enough for at
least 10,000 requests to each of the two generation APIs, all on one connection per test,
through the real stack. Requests that would generate ask for a few tokens.

A hostile render and an answer too deep to check: test_hostile_render.py."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.e2e.conftest import MODEL, RunningStack
from tests.e2e.hostile_mutations import BATCHES, ODD_STRINGS, Mutator

PER_API = 10_000  # requests each generation API must take
BATCH = 12  # requests per hypothesis example

# -- the connection and the checks of every answer ---------------------------------------------


@dataclass
class Wire:
    """One keep-alive connection; every answer checked, every request counted."""

    http: httpx.Client
    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    local: Any = None  # the client end of the one connection
    last: str = ""  # the request before, should the connection be gone

    def send(self, api: str, method: str, path: str, *, content: bytes | Iterator[bytes] | None = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        what = f"{method} {path} headers={headers!r} body={_short(content)}"
        try:
            resp = self.http.request(method, path, content=content, headers=headers)
            self.statuses[resp.status_code] += 1
        except httpx.TransportError as exc:
            raise AssertionError(f"the connection broke ({exc!r}) on {what}") from exc
        self.sent[api] += 1
        local = resp.extensions["network_stream"].get_extra_info("client_addr")
        assert self.local in (None, local), f"the server closed the keep-alive connection after {self.last}"
        self.local, self.last = local, what
        check_answer(resp, what)
        return resp


def _short(content: bytes | Iterator[bytes] | None) -> str:
    if content is None or isinstance(content, bytes):
        text = repr(content)
        return text if len(text) < 2000 else f"{text[:1500]}...({len(text)} chars)...{text[-300:]}"
    return "<chunked>"


def check_answer(resp: httpx.Response, what: str) -> None:
    assert resp.status_code < 500, f"{resp.status_code} {resp.text[:500]}\nfor {what}"
    kind = resp.headers.get("content-type", "")
    if resp.status_code >= 400:
        body = resp.json()
        error = body.get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict) and set(error) >= {"message", "type", "param", "code"}, f"{body} for {what}"
        assert isinstance(error["message"], str) and error["message"], f"{body} for {what}"
        assert isinstance(error["type"], str) and error["type"] != "server_error", f"{body} for {what}"
    elif kind.startswith("text/event-stream"):
        events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
        assert events or resp.request.method == "GET", f"an empty stream for {what}"  # a replay may be empty
        for data in events:
            assert "server_error" not in data and "internal_error" not in data, f"{data[:500]} for {what}"
    elif kind.startswith("application/json"):
        body = resp.json()
        assert "server_error" not in json.dumps(body)[:100_000], f"{str(body)[:500]} for {what}"


# -- mutation of JSON values ---------------------------------------------------------------------


FUZZ = settings(max_examples=math.ceil(PER_API / BATCH), deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],  # each failure names its request
                suppress_health_check=list(HealthCheck))


# -- the corpora: valid requests that exercise every part of each API -----------------------------


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city"], "additionalProperties": False}
ANSWER = {"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "array", "items": {"$ref": "#/$defs/n"}},
                                           "o": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/n"}]}},
          "required": ["a"], "additionalProperties": False, "$defs": {"n": {"type": "number"}}}


@dataclass(frozen=True)
class Seeds:
    """Stored state the corpora point at (ids a mutation can spoil)."""

    response_id: str
    conversation_id: str
    item_id: str
    compaction: str  # a sealed compaction item's encrypted_content
    encrypted_reasoning: str | None


@pytest.fixture(scope="module")
def seeds(stack: RunningStack) -> Seeds:
    with stack.http() as http:
        first = http.post("/v1/responses", json={"model": MODEL, "input": "Remember heron.", "max_output_tokens": 40,
                                                 "include": ["reasoning.encrypted_content"]}).json()
        items = http.get(f"/v1/responses/{first['id']}/input_items").json()["data"]
        conv = http.post("/v1/conversations", json={"items": [{"role": "user", "content": "hello"}],
                                                    "metadata": {"k": "v"}}).json()
        compact = http.post("/v1/responses/compact", json={"model": MODEL, "input": "Summarize me."}).json()
    sealed = [o["encrypted_content"] for o in compact["output"] if o.get("type") == "compaction"]
    reasoning = [o.get("encrypted_content") for o in first["output"] if o.get("type") == "reasoning"]
    return Seeds(first["id"], conv["id"], items[0]["id"], sealed[0], reasoning[0] if reasoning else None)


def chat_corpus() -> list[dict[str, Any]]:
    hi = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                             "parameters": WEATHER, "strict": True}}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools when useful."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}], "name": "alice"},
        {"role": "assistant", "content": None, "reasoning_content": "I need the weather.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.", "reasoning": "Done."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    return [
        {"model": MODEL, "messages": hi, "max_tokens": 2},
        {"model": MODEL, "messages": history, "tools": [tool], "max_tokens": 4, "temperature": 0.5, "top_p": 0.9,
         "seed": 7, "stop": ["\n\n", "END"], "user": "u1", "metadata": {"k": "v"}, "reasoning_effort": "low",
         "parallel_tool_calls": True, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"model": MODEL, "messages": hi, "max_completion_tokens": 3, "stream": True,
         "stream_options": {"include_usage": True},
         "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": ANSWER}}},
        {"model": MODEL, "messages": history[2:], "max_tokens": 3, "response_format": {"type": "json_object"},
         "tools": [tool], "tool_choice": "none", "n": 1, "logprobs": False, "store": False, "service_tier": "auto"},
        {"model": MODEL, "messages": history, "max_tokens": 4, "stream": True, "tools": [tool],
         "tool_choice": "required", "verbosity": "low", "prompt_cache_key": "k", "safety_identifier": "s"},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "input_text", "text": "b"}]}],
         "max_tokens": 1, "response_format": {"type": "text"}, "modalities": ["text"]},
    ]


def responses_corpus(seeds: Seeds) -> list[dict[str, Any]]:
    function = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER,
                "strict": True}
    namespace = {"type": "namespace", "name": "files", "description": "File tools",
                 "tools": [{"type": "function", "name": "read", "parameters": {
                     "type": "object", "properties": {"path": {"type": "string"}}}}]}
    mcp = {"type": "mcp", "server_label": "local", "server_url": "http://127.0.0.1:9/mcp",  # nothing listens
           "require_approval": "never", "allowed_tools": ["lookup"], "headers": {"X-Key": "v"}}
    reasoning: dict[str, Any] = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}],
                                 "content": [{"type": "reasoning_text", "text": "think"}]}
    if seeds.encrypted_reasoning:
        reasoning = {**reasoning, "encrypted_content": seeds.encrypted_reasoning}
    history = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        reasoning,
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "files", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "file"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}],
         "status": "completed", "phase": "final_answer"},
        {"role": "user", "content": "thanks"},
    ]
    mcp_items = [
        {"type": "mcp_list_tools", "id": "ml_1", "server_label": "local",
         "tools": [{"name": "lookup", "input_schema": {"type": "object"}}]},
        {"type": "mcp_call", "id": "mc_1", "server_label": "local", "name": "lookup", "arguments": "{}",
         "output": "found"},
        {"type": "mcp_approval_request", "id": "ma_1", "server_label": "local", "name": "lookup", "arguments": "{}"},
        {"type": "mcp_approval_response", "approval_request_id": "ma_1", "approve": False, "reason": "no"},
        {"role": "user", "content": "go on"},
    ]
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    return [
        {"model": MODEL, "input": "hi", "max_output_tokens": 2},
        {"model": MODEL, "input": history, "instructions": "Answer briefly.", "tools": [function, namespace],
         "tool_choice": "auto", "parallel_tool_calls": True, "temperature": 0.7, "top_p": 0.9, "max_tool_calls": 2,
         "reasoning": {"effort": "low", "summary": "auto"}, "text": {"format": fmt, "verbosity": "low"},
         "metadata": {"k": "v"}, "user": "u", "store": False, "include": ["reasoning.encrypted_content"],
         "truncation": "disabled", "max_output_tokens": 4, "service_tier": "auto"},
        {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 3, "tools": [function],
         "tool_choice": {"type": "function", "name": "get_weather"}, "stream_options": {"include_obfuscation": False}},
        {"model": MODEL, "input": [{"role": "user", "content": "more"}], "previous_response_id": seeds.response_id,
         "max_output_tokens": 2, "text": {"format": {"type": "json_object"}}},
        {"model": MODEL, "input": "again", "conversation": {"id": seeds.conversation_id}, "max_output_tokens": 2,
         "store": False},
        {"model": MODEL, "input": mcp_items, "tools": [mcp], "max_output_tokens": 2, "prompt_cache_key": "p"},
        {"model": MODEL, "input": [{"type": "item_reference", "id": seeds.item_id},
                                   {"type": "compaction", "encrypted_content": seeds.compaction},
                                   {"type": "web_search_call", "id": "ws_1"}, {"role": "user", "content": "ok"}],
         "max_output_tokens": 2, "tools": [{"type": "web_search"}], "tool_choice": "none"},
        {"model": MODEL, "input": "later", "background": True, "store": True, "max_output_tokens": 2},
        {"model": MODEL, "input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger"}],
         "context_management": [{"type": "compaction", "compact_threshold": 1000}], "max_output_tokens": 2},
    ]


# -- the fuzz ------------------------------------------------------------------------------------


def fuzz(stack: RunningStack, api: str, path: str, corpus: list[Any], methods: list[str]) -> Wire:
    """``PER_API`` hostile requests to ``path``, on one keep-alive connection."""
    started = time.monotonic()
    with stack.http() as http:
        w = Wire(http)

        @FUZZ
        @given(BATCHES)
        def batch(plan: tuple[int, list[Any]]) -> None:
            m = Mutator(*plan)
            for _ in range(BATCH):
                content, headers = m.request(corpus)
                method = "POST" if m.rnd.random() < 0.98 else m.rnd.choice(methods)
                w.send(api, method, path, content=content, headers=headers)

        batch()
        assert w.send("models", "GET", "/v1/models").status_code == 200  # the same connection still serves
        assert http.get("/health").status_code == 200
    print(f"\n{api}: {w.sent[api]} requests in {time.monotonic() - started:.1f}s, statuses {dict(w.statuses)}")
    return w


@pytest.mark.slow
def test_chat_completions_take_hostile_requests(stack: RunningStack) -> None:
    w = fuzz(stack, "chat", "/v1/chat/completions", chat_corpus(), ["PUT", "GET", "DELETE", "PATCH"])
    assert w.sent["chat"] >= PER_API


@pytest.mark.slow
def test_responses_take_hostile_requests(stack: RunningStack, seeds: Seeds) -> None:
    w = fuzz(stack, "responses", "/v1/responses", responses_corpus(seeds), ["PUT", "PATCH", "DELETE"])
    assert w.sent["responses"] >= PER_API


RAW_QUERY = ["%ff", "%", "%zz", "limit=%00", "&&&", "=", "limit=1&limit=x", "%C0%AF", "order=%ED%A0%80", "a[b]=c"]
QUERY_KEYS = ["limit", "order", "after", "before", "include", "include[]", "stream", "starting_after", "x"]
QUERY_VALUES = ["1", "100", "101", "0", "-1", "1e3", "1.5", "", "asc", "desc", "ASC", "true", "maybe",
                "99999999999999999999999", "%ff", "\x00", "a" * 5000, *ODD_STRINGS]
OTHER_EXAMPLES = 250


def _quoted(text: str) -> str:
    """Percent-encoded as UTF-8, a lone surrogate included (as the bytes a careless client sends)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@pytest.mark.slow
def test_other_routes_take_hostile_requests(stack: RunningStack, seeds: Seeds) -> None:
    """Compaction, conversations and input-item listings, with odd bodies and query strings."""
    started = time.monotonic()
    with stack.http() as http:
        conv = http.post("/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]}).json()["id"]
        posts = {
            "/v1/responses/compact": [
                {"model": MODEL, "input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                 "instructions": "short", "reasoning": {"effort": "low"}},
                {"model": MODEL, "previous_response_id": seeds.response_id, "input": "and this"},
            ],
            "/v1/conversations": [
                {"items": [{"role": "user", "content": "hi"},
                           {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}],
                 "metadata": {"topic": "t"}},
            ],
            f"/v1/conversations/{conv}/items": [{"items": [{"type": "message", "role": "user",
                                                            "content": [{"type": "input_text", "text": "x"}]}]}],
            f"/v1/conversations/{conv}": [{"metadata": {"a": "b"}}],
        }
        listings = [f"/v1/responses/{seeds.response_id}/input_items", f"/v1/conversations/{conv}/items",
                    f"/v1/responses/{seeds.response_id}"]
        w = Wire(http)

        @settings(FUZZ, max_examples=OTHER_EXAMPLES)
        @given(BATCHES)
        def batch(plan: tuple[int, list[Any]]) -> None:
            m = Mutator(*plan)
            rnd = m.rnd
            for _ in range(BATCH):
                if rnd.random() < 0.5:
                    path = rnd.choice(sorted(posts))
                    content, headers = m.request(posts[path])
                    w.send(path, "POST", path, content=content, headers=headers)
                    continue
                path = rnd.choice(listings)
                if rnd.random() < 0.1:  # an odd id in the path
                    odd = _quoted(rnd.choice([m.text(), *ODD_STRINGS])) or "x"
                    path = path.replace(seeds.response_id, odd).replace(conv, odd)
                query = [f"{_quoted(rnd.choice([*QUERY_KEYS, m.text()]))}={_quoted(rnd.choice([*QUERY_VALUES, m.text()]))}"
                         for _ in range(rnd.randrange(5))]
                query += rnd.sample(RAW_QUERY, rnd.choice((0, 0, 1, 2)))
                w.send("listing", "GET", f"{path}?{'&'.join(query)}" if query else path)

        batch()
        assert w.send("models", "GET", "/v1/models").status_code == 200
        assert http.get("/health").status_code == 200
    print(f"\nother routes: {dict(w.sent)} in {time.monotonic() - started:.1f}s, statuses {dict(w.statuses)}")
    assert sum(w.sent.values()) >= OTHER_EXAMPLES * BATCH


# -- an answer too deep to check ------------------------------------------------------------------
