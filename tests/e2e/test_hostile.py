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
The corpora are in hostile_corpus.py, the mutations in hostile_mutations.py.

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
from tests.e2e.hostile_corpus import Seeds, chat_corpus, responses_corpus
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

    def send(
        self,
        api: str,
        method: str,
        path: str,
        *,
        content: bytes | Iterator[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
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


# -- stored state the corpora point at -----------------------------------------------------------


@pytest.fixture(scope="module")
def seeds(stack: RunningStack) -> Seeds:
    with stack.http() as http:
        first = http.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": "Remember heron.",
                "max_output_tokens": 40,
                "include": ["reasoning.encrypted_content"],
            },
        ).json()
        items = http.get(f"/v1/responses/{first['id']}/input_items").json()["data"]
        conv = http.post(
            "/v1/conversations", json={"items": [{"role": "user", "content": "hello"}], "metadata": {"k": "v"}}
        ).json()
        compact = http.post("/v1/responses/compact", json={"model": MODEL, "input": "Summarize me."}).json()
    sealed = [o["encrypted_content"] for o in compact["output"] if o.get("type") == "compaction"]
    reasoning = [o.get("encrypted_content") for o in first["output"] if o.get("type") == "reasoning"]
    return Seeds(first["id"], conv["id"], items[0]["id"], sealed[0], reasoning[0] if reasoning else None)


# -- the fuzz ------------------------------------------------------------------------------------


FUZZ = settings(
    max_examples=math.ceil(PER_API / BATCH),
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # each failure names its request
    suppress_health_check=list(HealthCheck),
)


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
QUERY_VALUES = [
    "1",
    "100",
    "101",
    "0",
    "-1",
    "1e3",
    "1.5",
    "",
    "asc",
    "desc",
    "ASC",
    "true",
    "maybe",
    "99999999999999999999999",
    "%ff",
    "\x00",
    "a" * 5000,
    *ODD_STRINGS,
]
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
        posts: dict[str, list[dict[str, Any]]] = {
            "/v1/responses/compact": [
                {
                    "model": MODEL,
                    "input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                    "instructions": "short",
                    "reasoning": {"effort": "low"},
                },
                {"model": MODEL, "previous_response_id": seeds.response_id, "input": "and this"},
            ],
            "/v1/conversations": [
                {
                    "items": [
                        {"role": "user", "content": "hi"},
                        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    ],
                    "metadata": {"topic": "t"},
                }
            ],
            f"/v1/conversations/{conv}/items": [
                {"items": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}]}
            ],
            f"/v1/conversations/{conv}": [{"metadata": {"a": "b"}}],
        }
        listings = [
            f"/v1/responses/{seeds.response_id}/input_items",
            f"/v1/conversations/{conv}/items",
            f"/v1/responses/{seeds.response_id}",
        ]
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
                query = [
                    f"{_quoted(rnd.choice([*QUERY_KEYS, m.text()]))}={_quoted(rnd.choice([*QUERY_VALUES, m.text()]))}"
                    for _ in range(rnd.randrange(5))
                ]
                query += rnd.sample(RAW_QUERY, rnd.choice((0, 0, 1, 2)))
                w.send("listing", "GET", f"{path}?{'&'.join(query)}" if query else path)

        batch()
        assert w.send("models", "GET", "/v1/models").status_code == 200
        assert http.get("/health").status_code == 200
    print(f"\nother routes: {dict(w.sent)} in {time.monotonic() - started:.1f}s, statuses {dict(w.statuses)}")
    assert sum(w.sent.values()) >= OTHER_EXAMPLES * BATCH
